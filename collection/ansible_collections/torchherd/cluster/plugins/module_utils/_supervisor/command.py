# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The launcher's command line on this node (in the job's image, where it has one) and the
job's environment."""

from __future__ import annotations

import os
import sys

from ansible_collections.torchherd.cluster.plugins.module_utils._container import (
    SHIM,
    container_name,
    run_argv,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import MARKER
from ansible_collections.torchherd.cluster.plugins.module_utils._stacks import flight_recorder_env


def launcher_argv(p, paths):
    """The command line of this node's launcher: the wrapper (srun), the launcher with what the
    plan decided for this node, the user's launcher options, the script and its arguments; in
    the job's image, all that inside the runtime's run (container_argv)."""
    python = p["python"] or sys.executable
    argv = LAUNCHERS[p["launcher"]].argv(p, paths, python)
    argv = list(p["wrapper"]) + argv + list(p["launcher_args"]) + [p["script"]] + list(p["args"])
    return container_argv(p, paths, argv, python) if p.get("container") else argv


# Variables of the node's own environment the job's container gets too (the node's choice of
# GPUs and NCCL's and gloo's settings there); the rest of the node's environment (its PATH, its
# Python's) is the node's, not the image's.
NODE_ENV_PREFIXES = ("NCCL_", "GLOO_", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
                     "NVIDIA_VISIBLE_DEVICES")


def container_argv(p, paths, argv, python):
    """`argv` run in the job's image: the synced code (the working directory) and the run
    directory at their own paths, the job's environment by name (the values go to the runtime
    in its environment: see spawn), its secrets through standard input (SHIM)."""
    spec = p["container"]
    prefix = run_argv(spec, name=container_name(p["run_id"], p["node_rank"], p["restart"]),
                      mounts=[p["chdir"], paths["dir"]], workdir=p["chdir"],
                      env_names=container_env_names(p, paths), gpus=spec.get("gpus"),
                      stdin=bool(p["secret_env"]), volumes=spec.get("volumes") or [],
                      options=spec.get("options") or [])
    return prefix + ([python, "-c", SHIM] if p["secret_env"] else []) + argv


def container_env_names(p, paths, environ=None):
    """The variables the job's container gets: the job's own but its secrets, and the node's
    NODE_ENV_PREFIXES ones."""
    names = set(job_env(p, paths["dir"], {})[0]) - set(p["secret_env"])
    names |= {k for k in (os.environ if environ is None else environ)
              if k.startswith(NODE_ENV_PREFIXES)}
    return sorted(names)


def job_env(p, run_dir, environ):
    """(environment of the job, the same as written to env.json with secret values redacted)."""
    env = dict(environ)
    # Ansible's own variables must not leak into the job.
    for key in [k for k in env if k.startswith("ANSIBLE_")]:
        del env[key]
    if p["rdzv"] == "c10d":
        # A fresh worker store per rendezvous round: see the module's rdzv option.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # What the launcher needs besides its command line, shown in env.json with the job's own.
    launcher_env = dict(LAUNCHERS[p["launcher"]].env(p))
    if str(p["env"].get("TORCHHERD_BACKEND")) == "nccl":
        # Every rank keeps a record of its last collectives and dumps it when asked (stacks)
        # or when its watchdog times out: where a hung job's ranks were in NCCL.
        launcher_env.update(flight_recorder_env(os.path.join(run_dir, "flight_recorder"),
                                                p["torch_version"], set(env) | set(p["env"])))
    env.update(launcher_env)
    env.update({k: str(v) for k, v in p["env"].items()})
    env.update({k: str(v) for k, v in p["secret_env"].items()})
    # TORCHHERD_PROGRESS_FILE: a job that may stay silent for long touches it to show progress
    # (the hang watch counts it as output).
    # TORCHHERD_RESTART: the whole-job restart this is (0 first), for a script that resumes.
    env.update({MARKER: run_dir, "TORCHHERD_RUN_ID": p["run_id"], "PYTHONUNBUFFERED": "1",
                "TORCHHERD_PROGRESS_FILE": os.path.join(run_dir, "progress"),
                "TORCHHERD_RESTART": str(p.get("restart") or 0)})
    shown = dict(launcher_env, **{k: str(v) for k, v in p["env"].items()})
    shown.update({k: "********" for k in p["secret_env"]})
    return env, shown
