#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: node_facts
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: Gather what a torchrun launch needs to know about one node, in one round trip
description:
  - Reports the job interpreter and its torch build (version, CUDA, NCCL, gloo, GPUs), the
    node's host name and addresses, whether the master port is free, free disk at torchherd's
    directory, and jobs of torchherd still running there.
  - Reports what NCCL and the GPUs need of the node as it is now - the processes holding its
    GPUs, the GPUs' modes and ECC state, Xid errors in the kernel log, the host identity NCCL
    uses, C(/dev/shm), the locked-memory limit, InfiniBand/RoCE ports - for the gate's checks.
  - Replaces C(gather_facts) for launches, with one module call per node and nothing else.
  - The torch probe runs in a subprocess of the job's interpreter, which may differ from the
    one running this module (a venv, say).
  - The GPUs are read without CUDA, from C(nvidia-smi --query-gpu) or else the NVIDIA driver's
    files under C(/proc/driver/nvidia), with C(CUDA_VISIBLE_DEVICES) applied; the torch probe
    then counts them through NVML and creates no CUDA context. Only where neither is there, or
    C(CUDA_VISIBLE_DEVICES) names MIG instances (or indices among GPUs of other models without
    C(CUDA_DEVICE_ORDER=PCI_BUS_ID)), does torch's CUDA list them.
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.INFO_MODULE
attributes:
  check_mode:
    details: It reads and reports; it writes its own cache of the torch probe
      (O(cache_seconds)), in check mode too, and makes the job's venv where O(venv) asks for
      one, not in check mode.
options:
  python:
    description:
      - Interpreter of the job; empty means the one running this module. C(~) is the node
        user's home.
      - With O(venv), the venv's interpreter (the plan's C(<root>/venvs/<key>/bin/python)).
    type: path
    default: ""
  root:
    description: torchherd's directory on the node (runs and code live under it).
    type: path
    required: true
  port:
    description: Port to check for being free (the master port); 0 skips the check.
    type: int
    default: 0
  probe_timeout:
    description: Seconds allowed for importing torch in the job interpreter.
    type: float
    default: 60
  cache_seconds:
    description:
      - Reuse the last successful torch probe of this interpreter for this long; 0 probes every time.
      - Importing torch costs seconds of CPU on every node and launch. The cached answer is used
        only while everything it depends on is unchanged - the interpreter, the torch install
        (its files' times), C(LD_LIBRARY_PATH), C(CUDA_VISIBLE_DEVICES), C(CUDA_DEVICE_ORDER),
        the NVIDIA driver version and the GPUs the driver lists (model, UUID, bus) - so a
        reinstall, a driver update or a GPU gone missing probes again. The GPUs' state (modes,
        ECC and page counts) and the processes holding them are read on every call.
      - Stored in C(<root>/.torch-probe.json).
    type: int
    default: 0
  code_dir:
    description:
      - Where the job's code lives on the node (the sync's destination); with O(code_files),
        the module hashes the code already there (see RV(code_hash)).
    type: path
    default: ""
  code_files:
    description: The files of the job's code (the controller's manifest) to hash in O(code_dir).
    type: list
    elements: str
    default: []
  code_expect:
    description:
      - The controller's hash of the job's code; RV(code_current) says whether the code in
        O(code_dir) is that. Empty compares nothing.
    type: str
    default: ""
  master_addr:
    description:
      - The master's address (or name) as the job reaches it; with it, the module chooses the
        interface the job's traffic uses on this node (see RV(interface)). Empty skips that.
    type: str
    default: ""
  interface:
    description:
      - The interface the user named for this node; empty lets the route to O(master_addr)
        decide.
    type: str
    default: ""
  container:
    description:
      - The job's container image. The runtime is found (O(container.runtime)), the image
        looked for and pulled where O(container.pull) says so (see RV(container)), and the
        interpreter's and torch's facts are read inside the image (O(python) is the image's -
        C(python3) finds it on the image's C(PATH)), with the node's GPUs given to it, the host's
        network and IPC, and the job's O(container.volumes) and O(container.options). The cached
        answer is kept while the image's id is the same.
      - An image that cannot be had is no failure of the module; C(error) in RV(container) says
        why, and no interpreter is probed. In check mode nothing is pulled.
      - Empty (the default) runs on the node itself.
    type: dict
    default: {}
    suboptions:
      image:
        description: The image, as the runtime names it (C(nvcr.io/nvidia/pytorch:25.01-py3)).
        type: str
      runtime:
        description:
          - The runtime; C(auto) takes the first of podman, docker, apptainer and singularity on
            C(PATH).
          - apptainer (and singularity) run a SIF file or sandbox directory on the node
            (O(container.image) its path), or pull an image given as a C(docker://), C(oras://)
            or C(library://) URI into a SIF file under O(root)C(/images).
        type: str
        default: auto
        choices: [auto, podman, docker, apptainer, singularity]
      pull:
        description:
          - C(missing) pulls the image where the node lacks it, C(always) on every launch (a
            moving tag), C(never) refuses a node without it.
        type: str
        default: missing
        choices: [missing, always, never]
      volumes:
        description: The job's own volumes, in the runtime's C(--volume) syntax.
        type: list
        elements: str
        default: []
      options:
        description: The job's own options of the runtime's C(run) (C(--shm-size=16g)).
        type: list
        elements: str
        default: []
  venv:
    description:
      - The job's locked venv. Before anything else, the module makes it with uv at O(venv.path)
        from O(venv.lock), or reuses it where the same O(venv.key) made it before (see
        RV(venv)); O(python) is then its interpreter. Empty (the default) makes none.
      - uv is the one named, else on C(PATH), in C(~/.local/bin), C(<root>/tools/uv), or
        C(<base_python> -m uv); without one it is installed with pip into C(<root>/tools/uv)
        from the same index or wheelhouse. uv's cache is C(<root>/cache/uv).
      - A venv that cannot be made is no failure of the module; C(error) in RV(venv) says why. In
        check mode, a venv that is not there yet is not made (C(missing) in RV(venv)).
    type: dict
    default: {}
    suboptions:
      path:
        description: The venv's directory.
        type: path
      key:
        description:
          - The plan's hash of the lock, of O(venv.system_site_packages) and of the base
            interpreter; the venv there is reused while it is the same.
        type: str
      lock:
        description:
          - The lock's text, a requirements file whose every requirement is pinned, or uv's
            lock (with O(venv.project)).
        type: str
      project:
        description:
          - The text of the C(pyproject.toml) beside uv's lock (C(uv.lock)); uv exports the lock
            to pinned requirements first.
        type: str
      base_python:
        description: The interpreter the venv is made from; empty means the one running this module.
        type: path
        default: ""
      index_url:
        description: The package index to install from; empty means uv's default.
        type: str
        default: ""
      find_links:
        description:
          - Wheelhouses (directories on the node or URLs); without O(venv.index_url), no index is
            used.
        type: list
        elements: str
        default: []
      system_site_packages:
        description: Whether the venv sees the base interpreter's packages too.
        type: bool
        default: false
      uv:
        description: The uv to run; empty finds one.
        type: path
        default: ""
  warm:
    description:
      - The job's launcher started ahead, where the schedule says so (its C(start.warm)); at
        the end of this call, the job's interpreter (O(python)) starts in the background,
        imports O(warm.module) and waits up to O(warm.deadline) seconds for the start of run
        O(warm.run_id), which hands it the launcher's command line
        (M(torchherd.cluster.torchrun_job)'s O(torchherd.cluster.torchrun_job#module:warm)).
        Its imports (torch) then happen while the launch is still in preflight.
      - It carries the run's marker (a stop of the run id ends it), and ends by itself at the
        deadline where no start came (a launch that failed before its start).
      - Not started in check mode, in the job's image (O(container)), where the interpreter or
        torch could not be read, or where the run id is already on this node.
      - Empty (the default) starts none.
    type: dict
    default: {}
    suboptions:
      run_id:
        description: The run it waits for.
        type: str
      module:
        description: The launcher's module (run with C(-m)), imported ahead.
        type: str
        default: torch.distributed.run
      env:
        description: The job's variables (not its secrets), in its environment from the start
          (a few are read at import).
        type: dict
        default: {}
      deadline:
        description: Seconds it waits for the start.
        type: float
        default: 60
"""

EXAMPLES = r"""
- name: Gather node facts
  torchherd.cluster.node_facts:
    python: /opt/venv/bin/python
    root: /var/tmp/torchherd
    port: 29500
  register: facts
"""

RETURN = r"""
hostname:
  description: The node's host name.
  returned: always
  type: str
  sample: node0
euid:
  description: The effective user id the job runs as on the node (0 is root).
  returned: always
  type: int
  sample: 1000
root:
  description: torchherd's directory with C(~) expanded.
  returned: always
  type: str
  sample: /root/.torchherd
venv:
  description:
    - The job's locked venv where O(venv) was given, else null - C(path), C(python), C(key),
      C(made) (true where this call made it, false where it was reused), C(seconds) this call
      spent on it, C(uv) (its version), C(packages) (as C(uv pip freeze) lists them), or
      C(error) where it could not be made, C(missing) where check mode did not make it.
  returned: always
  type: dict
  sample: {path: /root/.torchherd/venvs/3f9a1c2e7b4d5a60, made: false, seconds: 0.001, uv: uv 0.13.9}
python:
  description: Path, version and executable of the job interpreter; C(error) when it does not run.
  returned: always
  type: dict
  sample: {path: /usr/bin/python3, version: 3.11.2, executable: /usr/bin/python3, error: null}
torch:
  description:
    - The torch build of the job interpreter; C(error) says why it could not be imported.
    - C(launchers) has the installed version of every launcher that torch does not bring
      (accelerate, deepspeed) for that interpreter, null where one is not installed.
    - C(gpus) are the GPUs the job sees (C(CUDA_VISIBLE_DEVICES) applied), each with C(index),
      C(uuid) (without the C(GPU-) prefix), C(name), C(memory_bytes), C(bus),
      C(persistence_mode) and C(compute_mode), C(compute_cap) (C(9.0)), C(mig_mode)
      (C(Enabled), C(Disabled)), C(ecc_uncorrected) (volatile uncorrected ECC errors),
      C(retired_pending) and C(remapped_pending) (retired pages or remapped rows waiting for a
      GPU reset) (null where their source does not say; from C(proc), all of these are null);
      C(gpus_from) says where they were read (C(nvidia-smi), C(proc), or C(torch), whose
      entries have the first four only) and C(driver) is the NVIDIA driver's version (null
      without one). C(gpu_count) is torch's count.
    - C(arch_list) is C(torch.cuda.get_arch_list()), the GPU architectures the build has kernels
      (C(sm_90)) or PTX (C(compute_90)) for; empty without CUDA.
  returned: always
  type: dict
  sample:
    version: 2.13.0+cu130
    cached: false
    cuda: "13.0"
    cuda_available: true
    gpu_count: 1
    gpus:
      - {index: 0, uuid: 5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d, name: NVIDIA H100 80GB HBM3,
         memory_bytes: 85520809984, bus: null, persistence_mode: true, compute_mode: Default,
         compute_cap: "9.0", mig_mode: Disabled, ecc_uncorrected: 0, retired_pending: null,
         remapped_pending: false}
    arch_list: [sm_75, sm_80, sm_86, sm_90, sm_100, sm_120]
    gpus_from: nvidia-smi
    driver: 570.124.06
    nccl: 2.28.9
    nccl_available: true
    launchers: {accelerate: 1.15.0, deepspeed: null}
    gloo_available: true
    error: null
code_current:
  description:
    - Whether the code in O(code_dir) is the controller's (RV(code_hash) equals O(code_expect)),
      so that the sync has nothing to send to this node; false where either is empty.
  returned: always
  type: bool
  sample: true
code_hash:
  description:
    - Content hash of O(code_files) in O(code_dir), computed as the controller computes its own,
      so that a relaunch with unchanged code can skip the sync; null when O(code_dir) is not
      there, a file is missing, or no files were given.
  returned: always
  type: str
  sample: 9f2c1e...
cuda_visible_devices:
  description: CUDA_VISIBLE_DEVICES of the node's environment, null when unset.
  returned: always
  type: str
  sample: "0,1"
addresses:
  description: IPv4 and IPv6 addresses by interface (loopback included).
  returned: always
  type: dict
  sample: {eth0: [10.66.101.10]}
interface:
  description:
    - The interface the job's traffic leaves this node on, for GLOO_SOCKET_IFNAME and
      NCCL_SOCKET_IFNAME, and its own address (the one the start's barrier connects from);
      null without O(master_addr).
    - C(how) says how it was chosen - C(explicit) (O(interface)), C(local) (the interface
      holding O(master_addr), so this node is the master), C(route) (the one the kernel's route to
      O(master_addr) leaves on) - and C(master) is the address O(master_addr) resolved to.
    - C(speed) is the link speed the kernel reports for it in Mb/s (the interconnect check's
      threshold may be a share of it); null where it reports none.
    - C(error) says why none could be chosen (no such interface, no address of the master's
      family on it, no route), with the node's interfaces or routes; null otherwise.
  returned: always
  type: dict
  sample: {name: data0, address: 10.67.101.11, how: route, master: 10.67.101.10, speed: 10000, error: null}
port_free:
  description: Whether O(port) can be bound on this node; null when not checked.
  returned: always
  type: bool
  sample: true
disk_free_bytes:
  description: Free bytes on the file system holding O(root).
  returned: always
  type: int
  sample: 52428800000
py_spy:
  description: Path of py-spy next to the job's interpreter or on C(PATH) (what reads the ranks'
    stacks after a hang), null when missing.
  returned: always
  type: str
  sample: /opt/venv/bin/py-spy
rsync:
  description: Path of rsync on the node, null when missing.
  returned: always
  type: str
  sample: /usr/bin/rsync
running_jobs:
  description: Run directories of torchherd jobs with live processes on this node, with their
    pids (read before O(warm) starts its launcher).
  returned: always
  type: dict
  sample: {}
warm:
  description:
    - The launcher O(warm) started ahead - C(started), C(pid), C(deadline) - or why none was
      (C(started) false, C(error)); null without O(warm).
  returned: always
  type: dict
  sample: {started: true, pid: 4242, deadline: 60}
gpu_processes:
  description:
    - The processes holding a GPU now (C(nvidia-smi --query-compute-apps)), each with
      C(gpu_uuid) (without C(GPU-)), C(pid), C(used_memory_bytes) and C(name); null where
      nvidia-smi is not there to say.
  returned: always
  type: list
  elements: dict
  sample: [{gpu_uuid: 5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d, pid: 4242, used_memory_bytes: 1048576000, name: python3}]
xid:
  description: The NVIDIA driver's Xid reports in the kernel log since boot (the last 20), from
    C(/dev/kmsg); null where the log cannot be read (no C(CAP_SYSLOG)) or there is no driver.
  returned: always
  type: list
  elements: str
  sample: ["NVRM: Xid (PCI:0000:18:00): 79, pid=1234, GPU has fallen off the bus."]
boot_id:
  description: C(/proc/sys/kernel/random/boot_id); with the host name, how NCCL tells hosts apart.
  returned: always
  type: str
  sample: 2f1d3c4b-0a9e-4b8f-9d7c-6e5f4a3b2c1d
shm_bytes:
  description: The size of C(/dev/shm), null where there is none.
  returned: always
  type: int
  sample: 67108864
memlock:
  description: The locked-memory limit (C(ulimit -l)) the job inherits, in bytes, or C(unlimited).
  returned: always
  type: raw
  sample: unlimited
container:
  description:
    - The job's image on this node (only with O(container)) - C(runtime) and C(path) (null
      without one), C(image), C(id) (what the job runs, the image's id, null where it is not
      there; for apptainer the SIF file's path, with C(stamp), its size and time), C(pulled)
      (this call pulled it), C(seconds) (finding and pulling it) and C(error) (why the job
      cannot run in it here, else null).
  returned: always
  type: dict
  sample: {runtime: podman, path: /usr/bin/podman, image: "localhost/train:1", id: 746fcdc62655,
           pulled: false, seconds: 0.08, error: null}
infiniband:
  description: The InfiniBand/RoCE devices under C(/sys/class/infiniband), each port's C(state)
    and C(link_layer); empty without any.
  returned: always
  type: dict
  sample: {mlx5_0: {"1": {state: ACTIVE, link_layer: InfiniBand}}}
gpu_nics:
  description:
    - How far each GPU (by UUID, without C(GPU-)) is from each InfiniBand/RoCE device on the
      PCI tree, in the words of C(nvidia-smi topo -m) - C(PIX) (one PCIe switch), C(PXB)
      (several), C(PHB) (the same host bridge), C(NODE) (the same NUMA node), C(SYS) (across
      NUMA nodes) - read from C(/sys); empty without GPUs or devices.
  returned: always
  type: dict
  sample: {5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d: {mlx5_0: PIX, mlx5_1: SYS}}
"""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchherd.cluster.plugins.module_utils._codehash import tree_hash
from ansible_collections.torchherd.cluster.plugins.module_utils._container import (
    ensure as ensure_image,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._container import (
    run_argv,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._gpus import (
    HEALTH,
    gpu_files,
    read_gpus,
    read_xids,
    visible,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._hostfacts import host_facts
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import (
    distributions,
    packages,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._netpath import (
    interfaces,
    select,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    all_runs_with_processes,
    read_state,
    run_paths,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._stacks import py_spy_path
from ansible_collections.torchherd.cluster.plugins.module_utils._venv import VenvError, ensure
from ansible_collections.torchherd.cluster.plugins.module_utils._warm import start_warm

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
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump(entries, handle)
            os.replace(tmp, path)
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


def port_free(port):
    """Bind like a server would (SO_REUSEADDR, so TIME_WAIT leftovers don't count as in use)."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr, port))
        except OSError:
            return False
        finally:
            sock.close()
    return True


def free_disk(path):
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    stat = os.statvfs(path or "/")
    return stat.f_bavail * stat.f_frsize


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


def warm_launcher(p, python, py, torch, container, check_mode):
    """The job's launcher started ahead (_warm), or why not."""
    w = p["warm"]
    why = ("check mode" if check_mode else "the job runs in its image" if container else
           "the interpreter or torch could not be read" if py.get("error") or torch.get("error")
           or not torch.get("version") else None)
    paths = run_paths(p["root"], w["run_id"])
    if why is None and read_state(paths)["state"] != "absent":
        why = f"run {w['run_id']} is already on this node"
    if why:
        return {"started": False, "error": why}
    return start_warm(python, w["module"], paths["dir"], os.path.abspath(p["root"]), w["env"],
                      w["deadline"])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", default=""),
            root=dict(type="path", required=True),
            port=dict(type="int", default=0),
            probe_timeout=dict(type="float", default=60),
            cache_seconds=dict(type="int", default=0),
            code_dir=dict(type="path", default=""),
            code_files=dict(type="list", elements="str", default=[]),
            code_expect=dict(type="str", default=""),
            master_addr=dict(type="str", default=""),
            interface=dict(type="str", default=""),
            container=dict(type="dict", default={}, options=dict(
                image=dict(type="str"),
                runtime=dict(type="str", default="auto",
                             choices=["auto", "podman", "docker", "apptainer", "singularity"]),
                pull=dict(type="str", default="missing", choices=["missing", "always", "never"]),
                volumes=dict(type="list", elements="str", default=[]),
                options=dict(type="list", elements="str", default=[]),
            )),
            venv=dict(type="dict", default={}, options=dict(
                path=dict(type="path"),
                key=dict(type="str", no_log=False),
                lock=dict(type="str"),
                project=dict(type="str"),
                base_python=dict(type="path", default=""),
                index_url=dict(type="str", default="", no_log=True),
                find_links=dict(type="list", elements="str", default=[]),
                system_site_packages=dict(type="bool", default=False),
                uv=dict(type="path", default=""),
            )),
            warm=dict(type="dict", default={}, options=dict(
                run_id=dict(type="str"),
                module=dict(type="str", default="torch.distributed.run"),
                env=dict(type="dict", default={}),
                deadline=dict(type="float", default=60),
            )),
        ),
        supports_check_mode=True,
    )
    p = module.params
    python = p["python"] or sys.executable
    root = os.path.abspath(p["root"])
    venv = made_venv(p["venv"], root, module.check_mode) if (p["venv"] or {}).get("key") else None
    # Once per call, cached probe or not: who holds the GPUs and their health change any time.
    driver = read_gpus(NVIDIA_PROC)
    spec = p["container"] or {}
    # apptainer pulls an image given as a URI into a SIF file there.
    spec = dict(spec, cache_dir=os.path.join(root, "images"))
    container = ensure_image(spec, module.check_mode) if spec.get("image") else None
    if container and container["error"]:
        # The gate's container check says why; nothing runs in an image that is not there.
        py = {"path": python, "version": None, "error": None}
        torch = {"version": None, "error": None, "cached": False}
    else:
        prefix = run_argv(container, gpus=bool((driver or {}).get("gpus")),
                          volumes=spec["volumes"], options=spec["options"]) if container else ()
        py, torch = cached_probe(python, p["probe_timeout"], root, p["cache_seconds"], driver,
                                 container, prefix)
    refresh(torch, driver)
    ifaces = interfaces()
    code_hash = None
    code_dir = os.path.abspath(p["code_dir"]) if p["code_dir"] else ""
    if code_dir and p["code_files"] and os.path.isdir(code_dir):
        digest, missing = tree_hash(code_dir, p["code_files"])
        code_hash = None if missing else digest
    running_jobs = all_runs_with_processes()
    warm = None
    if (p["warm"] or {}).get("run_id"):
        warm = warm_launcher(p, python, py, torch, container, module.check_mode)
    module.exit_json(
        changed=False,
        hostname=socket.gethostname(),
        euid=os.geteuid(),
        root=root,
        venv=venv,
        container=container,
        python=py,
        torch=torch,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        addresses=ifaces,
        interface=select(p["master_addr"], p["interface"], ifaces) if p["master_addr"] else None,
        port_free=port_free(p["port"]) if p["port"] else None,
        disk_free_bytes=free_disk(root),
        rsync=shutil.which("rsync"),
        py_spy=py_spy_path(python),
        code_hash=code_hash,
        code_current=bool(code_hash) and code_hash == p["code_expect"],
        running_jobs=running_jobs,
        warm=warm,
        gpu_processes=(driver or {}).get("processes"),
        xid=read_xids() if driver else None,
        **host_facts((driver or {}).get("gpus"))
    )


if __name__ == "__main__":
    main()
