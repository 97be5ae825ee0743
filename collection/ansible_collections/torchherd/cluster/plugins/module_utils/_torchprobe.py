# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The job interpreter's torch, read in a subprocess of that interpreter (in the job's image
where it runs in one), with the GPUs the NVIDIA driver lists, and cached under torchherd's
directory while nothing it depends on changed (node_facts' C(cache_seconds))."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic
from ansible_collections.torchherd.cluster.plugins.module_utils._gpus import (
    HEALTH,
    gpu_files,
    read_gpus,
    visible,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import (
    distributions,
    packages,
)

# The installed version of every launcher that torch does not bring, by its distribution
# (nothing is imported); part of both programs below, which run in the job's interpreter.
LAUNCHER_VERSIONS = (f"DISTRIBUTIONS = {distributions()!r}\nPACKAGES = {packages()!r}\n"
                     + r"""

def launcher_versions():
    import importlib.util
    found = {}
    for name, distribution in DISTRIBUTIONS.items():
        # A launcher whose package this interpreter cannot import is not installed (or cannot
        # run): importlib.metadata, a tenth of a second to import, only where one is there.
        try:
            if importlib.util.find_spec(PACKAGES.get(name, distribution)) is None:
                found[name] = None
                continue
            import importlib.metadata as md
            found[name] = md.version(distribution)
        except Exception:
            found[name] = None
    return found
""")

# Printed as one JSON line by the job interpreter; stays importable on Python 3.8+. With the
# argument "nvml" (the module read the GPUs from the driver), torch counts them through NVML
# (torch's documented PYTORCH_NVML_BASED_CUDA_CHECK) and nothing here initializes CUDA.
TORCH_PROBE = LAUNCHER_VERSIONS + r"""
import json, os, platform, sys
nvml = sys.argv[1:] == ["nvml"]
if nvml:
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
out = {"python": {"path": sys.executable, "version": platform.python_version()}}
try:
    import torch
    import torch.distributed as dist
    t = {"version": torch.__version__, "cuda": torch.version.cuda,
         "cuda_available": bool(torch.cuda.is_available()), "gpus": [], "nccl": None,
         "nccl_available": bool(dist.is_available() and dist.is_nccl_available()),
         "gloo_available": bool(dist.is_available() and dist.is_gloo_available()), "error": None}
    t["gpu_count"] = torch.cuda.device_count() if t["cuda_available"] else 0
    for i in range(0 if nvml else t["gpu_count"]):
        p = torch.cuda.get_device_properties(i)
        t["gpus"].append({"index": i, "name": p.name, "memory_bytes": int(p.total_memory),
                          "uuid": str(getattr(p, "uuid", "") or ""),
                          "compute_cap": "%d.%d" % (p.major, p.minor)})
    # The architectures this build has kernels for (sm_90) or PTX (compute_90): read from the
    # build, no CUDA context.
    t["arch_list"] = list(torch.cuda.get_arch_list()) if t["cuda_available"] else []
    if t["nccl_available"] and t["cuda_available"]:
        v = torch.cuda.nccl.version()
        t["nccl"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
except Exception as exc:
    t = {"version": None, "error": "%s: %s" % (type(exc).__name__, exc)}
t["launchers"] = launcher_versions()
out["torch"] = t
print(json.dumps(out))
"""


# What the answer of TORCH_PROBE depends on, read without importing torch (~20 ms): describe()
# runs in the job's interpreter, in this process where that is the module's own interpreter.
FINGERPRINT = LAUNCHER_VERSIONS + r"""
import importlib.util, json, os, sys


def describe():
    spec = importlib.util.find_spec("torch")
    files = []
    if spec and spec.origin:
        top = os.path.dirname(spec.origin)
        for name in ("__init__.py", "version.py", os.path.join("lib", "libtorch_python.so")):
            try:
                st = os.stat(os.path.join(top, name))
                files.append([name, st.st_mtime_ns, st.st_size, st.st_ino])
            except OSError:
                files.append([name, None, None, None])
    return [os.path.realpath(sys.executable), sys.version, spec.origin if spec else None,
            files, list(launcher_versions().values())]
"""


# The NVIDIA driver's files: its version and one directory per GPU (read without a CUDA context).
NVIDIA_PROC = "/proc/driver/nvidia"
# probe reads the driver itself unless given its answer (None: there is no driver).
_UNREAD = object()
# A GPU's state that is read on every call, a cached probe or not.
LIVE = ("persistence_mode", "compute_mode") + tuple(key for key, _field in HEALTH)
# What changes the GPUs or the libraries the job's torch finds.
FINGERPRINT_ENV = ("LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "CUDA_HOME",
                   "NCCL_HOME")


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def fingerprint(python, timeout, driver=None, container=None):
    """Everything the torch probe's answer depends on, or None when it cannot be told;
    `driver`: read_gpus's answer, whose driver version and GPUs count too (nvidia-smi may see
    GPUs where the driver's /proc files are not mounted, as in some containers); `container`:
    the job's image (_container.ensure's answer), whose id stands for its interpreter."""
    # The same path as this module's interpreter (not merely the same file: a venv's python is
    # a link to the system's, with other packages) needs no interpreter of its own.
    if container:
        interp = {"image": container["id"], "runtime": container["path"], "python": python}
        if container.get("stamp"):  # a SIF file's id is its path: its size and time too
            interp["stamp"] = container["stamp"]
    elif python == sys.executable:
        scope = {}
        exec(compile(FINGERPRINT, "<fingerprint>", "exec"), scope)
        interp = json.loads(json.dumps(scope["describe"]()))
    else:
        try:
            proc = subprocess.run([python, "-c", FINGERPRINT + "\nprint(json.dumps(describe()))"],
                                  capture_output=True, text=True, timeout=timeout, check=False)
            interp = json.loads(proc.stdout.strip().splitlines()[-1])
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            return None
    gpus = sorted([bus, text] for bus, text in (gpu_files(NVIDIA_PROC) or {}).items())
    devs = sorted(d for d in os.listdir("/dev") if d.startswith("nvidia"))
    key = {"probe": hashlib.sha256(TORCH_PROBE.encode()).hexdigest(), "interpreter": interp,
           "env": [os.environ.get(k) for k in FINGERPRINT_ENV],
           "driver": _read(os.path.join(NVIDIA_PROC, "version")), "gpus": gpus, "devices": devs}
    if isinstance(driver, dict):
        key["read"] = [driver.get("driver"),
                       sorted(str(gpu.get("uuid")) for gpu in driver.get("gpus") or [])]
    # As the cache keeps it (JSON: lists, never tuples), so that an unchanged node compares
    # equal: with a GPU's tuple in it the cache never hit on a machine with an NVIDIA driver.
    return json.loads(json.dumps(key))


def cached_probe(python, timeout, root, max_age, driver=_UNREAD, container=None, prefix=()):
    """probe, reusing the last good answer while its fingerprint is unchanged; `driver` is
    read_gpus's answer where the caller has it; `container` the job's image and `prefix` the
    command line that runs the interpreter in it."""
    key = fingerprint(python, timeout, driver, container) if max_age > 0 else None
    if key is None:
        py, torch = probe(python, timeout, driver, prefix)
        return py, dict(torch, cached=False)
    # One file per root; a root on a shared file system holds one entry per node.
    name = f"{socket.gethostname()} {python}"
    if container:
        name += f" in {container['image']}"
    path = os.path.join(root, ".torch-probe.json")
    try:
        with open(path, encoding="utf-8") as handle:
            entry = json.load(handle)[name]
        if entry["key"] == key and 0 <= time.time() - entry["at"] <= max_age:
            return entry["python"], dict(entry["torch"], cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    py, torch = probe(python, timeout, driver, prefix)
    if torch.get("version") and not torch.get("error"):
        try:
            with open(path, encoding="utf-8") as handle:
                entries = json.load(handle)
            if not isinstance(entries, dict):
                entries = {}
        except (OSError, ValueError):
            entries = {}
        entries[name] = {"key": key, "at": time.time(), "python": py, "torch": torch}
        try:
            os.makedirs(root, exist_ok=True)
            write_atomic(path, json.dumps(entries))
        except OSError:
            pass  # a read-only root only costs the next launch another probe
    return py, dict(torch, cached=False)


def probe(python, timeout, driver=_UNREAD, prefix=()):
    """The job interpreter's torch (probe_torch) with the GPUs the driver lists (see _gpus):
    torch's CUDA lists them only where neither nvidia-smi nor the driver's files are there, or
    where CUDA_VISIBLE_DEVICES names them in a way that only CUDA can resolve."""
    driver = read_gpus(NVIDIA_PROC) if driver is _UNREAD else driver
    shown = None if driver is None else visible(
        driver["gpus"], os.environ.get("CUDA_VISIBLE_DEVICES"),
        os.environ.get("CUDA_DEVICE_ORDER"))
    py, torch = probe_torch(python, timeout, nvml=shown is not None, prefix=prefix)
    if torch.get("version"):
        torch["driver"] = driver["driver"] if driver else None
        torch["gpus_from"] = "torch" if shown is None else driver["source"]
        if shown is not None:
            # torch's own count (NVML's, CUDA_VISIBLE_DEVICES applied) says how many the job
            # gets; a CPU build of torch gets none.
            torch["gpus"] = shown if torch.get("cuda_available") else []
    return py, torch


def refresh(torch, driver):
    """The GPUs' state as the driver tells it now, over a cached probe's: modes and errors can
    change between launches, the GPUs themselves cannot (the probe's fingerprint has them)."""
    now = {gpu["uuid"]: gpu for gpu in (driver or {}).get("gpus") or []}
    for gpu in torch.get("gpus") or []:
        live = now.get(gpu.get("uuid"))
        if live:
            gpu.update((key, live[key]) for key in LIVE if key in live)
    return torch


def probe_torch(python, timeout, nvml=False, prefix=()):
    """The interpreter's and its torch's facts; `prefix`: the command line that runs the
    interpreter (in the job's image), if any."""
    try:
        proc = subprocess.run(list(prefix) + [python, "-c", TORCH_PROBE]
                              + (["nvml"] if nvml else []),
                              capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        err = f"interpreter {python} not found"
        return {"path": python, "version": None, "error": err}, {"version": None, "error": err}
    except subprocess.TimeoutExpired:
        err = f"importing torch in {python} took more than {timeout:g} s" + (
            " (in the image, runtime start included)" if prefix else "")
        return {"path": python, "version": None, "error": None}, {"version": None, "error": err}
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        err = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return {"path": python, "version": None, "error": err}, {"version": None, "error": err}
    out["python"].update(executable=python, error=None)
    return out["python"], out["torch"]
