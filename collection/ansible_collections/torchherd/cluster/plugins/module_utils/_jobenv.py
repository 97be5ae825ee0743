# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The job's environment on the node as node_facts finds or makes it: its locked venv, its
image with the interpreter's and torch's facts read in it, and its launcher started ahead."""

from __future__ import annotations

import os
import subprocess
import sys

from ansible_collections.torchherd.cluster.plugins.module_utils._container import (
    check_start,
    run_argv,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._container import (
    ensure as ensure_image,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    read_state,
    run_paths,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._torchprobe import (
    cached_probe,
    refresh,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._venv import VenvError, ensure
from ansible_collections.torchherd.cluster.plugins.module_utils._warm import start_warm


def made_venv(spec, root, dry=False):
    """The job's venv made or reused (see _venv.ensure); its error, not a failure, otherwise."""
    try:
        return ensure(spec["path"], spec["lock"] or "", spec["key"],
                      spec["base_python"] or sys.executable, root,
                      index_url=spec["index_url"], find_links=spec["find_links"],
                      system_site_packages=spec["system_site_packages"], uv=spec["uv"], dry=dry,
                      project=spec["project"])
    except (VenvError, OSError, subprocess.TimeoutExpired) as exc:
        return {"path": spec["path"], "key": spec["key"], "made": False, "error": str(exc)}


def job_interpreter(python, root, spec, timeout, max_age, driver, check_mode):
    """(the job's image or None, the interpreter's facts, torch's): `spec` is the container
    option (empty: the node itself), `driver` read_gpus's answer of this call, whose GPU state
    goes over a cached probe's."""
    # apptainer pulls an image given as a URI into a SIF file there.
    spec = dict(spec or {}, cache_dir=os.path.join(root, "images"))
    container = ensure_image(spec, check_mode) if spec.get("image") else None
    run = dict(gpus=bool((driver or {}).get("gpus")), volumes=spec.get("volumes") or (),
               options=spec.get("options") or ())
    if container and not container["error"]:
        # On every call, before the probe: a cached reading of torch in the image must not
        # hide a runtime that cannot start the container now (limits, its configuration).
        # An empty program of the job's interpreter: one start, a fraction of a second.
        start = container["start"] = check_start(container, [python, "-c", ""], **run)
        if start:
            code = f" (exit code {start['exit']})" if start["exit"] is not None else ""
            container["error"] = f"{container['runtime']} run failed{code}: {start['said']}"
    if container and container["error"]:
        # The gate's container checks say why; nothing runs in an image that is not there.
        py = {"path": python, "version": None, "error": None}
        torch = {"version": None, "error": None, "cached": False}
    else:
        prefix = run_argv(container, **run) if container else ()
        py, torch = cached_probe(python, timeout, root, max_age, driver, container, prefix)
    return container, py, refresh(torch, driver)


def warm_launcher(spec, root, python, py, torch, container, check_mode):
    """The job's launcher started ahead (_warm) as the warm option `spec` asks, or why not."""
    why = ("check mode" if check_mode else "the job runs in its image" if container else
           "the interpreter or torch could not be read" if py.get("error") or torch.get("error")
           or not torch.get("version") else None)
    paths = run_paths(root, spec["run_id"])
    if why is None and read_state(paths)["state"] != "absent":
        why = f"run {spec['run_id']} is already on this node"
    if why:
        return {"started": False, "error": why}
    return start_warm(python, spec["module"], paths["dir"], os.path.abspath(root), spec["env"],
                      spec["deadline"])
