# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The GPUs of an nccl job: no two nodes share one, and the GPUs each node's processes take are
free, of an architecture the torch build has kernels for, on a driver new enough for its CUDA
and in a compute mode that lets the job in (refusals); and healthy, shareable and without a
first launch that compiles every kernel (warnings)."""

from __future__ import annotations

import re

from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import (
    PREFLIGHT_WARN_FIX,
    mib,
    problem,
)

# NVIDIA's minimum Linux driver for each CUDA major version under minor version compatibility
# (CUDA Toolkit release notes, "CUDA Driver" table): any 12.x build runs on >= 525.60.13.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def _smi_uuid(uuid):
    """As nvidia-smi -L shows it (torch gives the UUID without the prefix)."""
    return uuid if str(uuid).startswith("GPU-") else f"GPU-{uuid}"


def _gpu(gpu):
    return f"GPU {gpu.get('index')} ({_smi_uuid(gpu.get('uuid'))})"


def _version(text):
    """"580.65.06" -> (580, 65, 6); None where it holds no number."""
    parts = re.findall(r"\d+", str(text or ""))
    return tuple(int(p) for p in parts) or None


def duplicate_gpus(usable, backend):
    """Two "nodes" on one machine sharing GPUs is NCCL's "Duplicate GPU detected"."""
    if backend != "nccl":
        return []
    owners = {}
    for host, f in usable.items():
        for gpu in f["torch"].get("gpus") or []:
            uuid = gpu.get("uuid")
            key = _smi_uuid(uuid) if uuid else f"{f.get('hostname')} GPU {gpu.get('index')}"
            owners.setdefault(key, []).append(host)
    return [problem(", ".join(sharing), "duplicate gpu", "each node its own GPUs",
                    f"{key} seen by all of them",
                    "list one inventory entry per machine, or give each entry "
                    "its own GPUs with CUDA_VISIBLE_DEVICES")
            for key, sharing in owners.items() if len(sharing) > 1]


def gpu_busy(host, f, needed, plan):
    """No process other than this run's holds a GPU the job's processes will use."""
    suffix = f"/runs/{plan['run_id']}"
    ours = {pid for run_dir, pids in (f.get("running_jobs") or {}).items()
            if run_dir.endswith(suffix) for pid in (pids or [])}
    holders = {}
    for proc in f.get("gpu_processes") or []:
        if proc.get("pid") not in ours:
            holders.setdefault(_smi_uuid(proc.get("gpu_uuid")), []).append(proc)
    problems = []
    for gpu in needed:
        procs = holders.get(_smi_uuid(gpu.get("uuid")))
        if not procs:
            continue
        found = ", ".join(
            f"pid {p.get('pid')} ({p.get('name') or '?'}"
            + (f", {mib(p['used_memory_bytes'])}" if p.get("used_memory_bytes") else "") + ")"
            for p in procs)
        problems.append(problem(
            host, "gpu busy", f"{_gpu(gpu)} free for the job", f"held by {found}",
            "stop that process (nvidia-smi lists it; a stale torchherd job: the stop playbook "
            "with its run id), or give the job other GPUs (CUDA_VISIBLE_DEVICES)"
            + PREFLIGHT_WARN_FIX.format(check="gpu busy")))
    return problems


def arch_support(cap, arch_list):
    """How a torch build with `arch_list` runs on a GPU of compute capability `cap` ("9.0"):
    "sass" (a kernel binary of its major version and a minor one not above its own, as CUDA
    loads them; sm_90a only on 9.0), "ptx" (only PTX of an architecture not above it, compiled
    by the driver at the first launch of each kernel) or None (it cannot)."""
    major, _dot, minor = str(cap).partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return "sass"  # unknown: nothing to say
    gpu = (int(major), int(minor))
    how = None
    for entry in arch_list:
        match = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", str(entry))
        if not match:
            continue
        kind, arch, suffix = match.group(1), (int(match.group(2)), int(match.group(3))), \
            match.group(4)
        fits = arch == gpu if suffix == "a" else arch[0] == gpu[0] and arch[1] <= gpu[1]
        if kind == "sm" and fits:
            return "sass"
        if kind == "compute" and (arch == gpu if suffix else arch <= gpu):
            how = "ptx"
    return how


def _caps(needed):
    return sorted({g["compute_cap"] for g in needed if g.get("compute_cap")})


def gpu_arch(host, f, needed, plan):
    """The torch build has kernels (or PTX) for the architecture of the job's GPUs."""
    arch_list = f["torch"].get("arch_list")
    if not arch_list:
        return []  # not read (a probe cached before it was): nothing to say
    return [problem(
        host, "gpu arch", f"sm_{cap.replace('.', '')} (or PTX at or below it) in torch "
        f"{f['torch'].get('version')}'s arch list", " ".join(arch_list),
        "install a torch build for this GPU (a newer release, or one built for its CUDA "
        "version) in the job's venv" + PREFLIGHT_WARN_FIX.format(check="gpu arch"))
        for cap in _caps(needed) if arch_support(cap, arch_list) is None]


def cuda_driver(host, f, needed, plan):
    """The NVIDIA driver is new enough for the CUDA version torch was built with."""
    torch = f["torch"]
    cuda, driver = _version(torch.get("cuda")), _version(torch.get("driver"))
    if not needed or not cuda or not driver or cuda[0] not in MIN_DRIVER:
        return []
    minimum = MIN_DRIVER[cuda[0]]
    if driver >= _version(minimum):
        return []
    return [problem(
        host, "cuda driver", f"NVIDIA driver >= {minimum} for torch {torch.get('version')} "
        f"(CUDA {torch.get('cuda')})", f"driver {torch.get('driver')}",
        "update the node's NVIDIA driver, or install the torch build for a CUDA version this "
        "driver supports (nvidia-smi's header names it)"
        + PREFLIGHT_WARN_FIX.format(check="cuda driver"))]


def gpu_prohibited(host, f, needed, plan):
    """No GPU of the job is in compute mode Prohibited (no process may use it)."""
    return [problem(
        host, "gpu compute mode", f"{_gpu(gpu)} usable (compute mode Default or "
        "Exclusive_Process)", "compute mode Prohibited",
        f"nvidia-smi -i {gpu.get('index')} -c DEFAULT as root, or give the job other GPUs "
        "(CUDA_VISIBLE_DEVICES)" + PREFLIGHT_WARN_FIX.format(check="gpu compute mode"))
        for gpu in needed if str(gpu.get("compute_mode") or "").lower() == "prohibited"]


def persistence(host, f, needed, plan):
    """Without persistence mode the driver sets each GPU up at every process start (1-3 s)."""
    off = [gpu for gpu in needed if gpu.get("persistence_mode") is False]
    if not off:
        return []
    return [problem(host, "persistence mode", "persistence mode on for the job's GPUs",
                    "off on " + ", ".join(_gpu(g) for g in off),
                    "run nvidia-persistenced (systemctl enable --now nvidia-persistenced), "
                    "or nvidia-smi -pm 1 as root")]


def gpu_memory_errors(host, f, needed, plan):
    """Uncorrected ECC errors, or retired pages / remapped rows waiting for a reset: the GPU's
    memory is failing, a job on it may crash or compute wrong."""
    problems = []
    for gpu in needed:
        found = []
        if gpu.get("ecc_uncorrected"):
            found.append(f"{gpu['ecc_uncorrected']} uncorrected ECC errors since the driver "
                         "loaded")
        if gpu.get("retired_pending"):
            found.append("retired pages pending")
        if gpu.get("remapped_pending"):
            found.append("remapped rows pending")
        if found:
            problems.append(problem(
                host, "gpu memory", f"{_gpu(gpu)} without uncorrected ECC errors or pending "
                "retirements", ", ".join(found),
                f"drain the node and reset the GPU (nvidia-smi -i {gpu.get('index')} -r as root, "
                "or reboot); if it comes back, report it to the machine's owner"))
    return problems


def xid_errors(host, f, needed, plan):
    """Xid errors since boot: the driver saw a GPU fault (fallen off the bus, double-bit ECC,
    a hung kernel)."""
    xids = f.get("xid") or []
    if not needed or not xids:
        return []
    return [problem(host, "xid", "no Xid errors in the kernel log since boot",
                    f"{len(xids)}, the last: {xids[-1][:200]}",
                    "look the Xid up in NVIDIA's Xid catalog; most ask for a GPU reset or "
                    "reboot, some for the machine's owner")]


def gpu_sharing(host, f, needed, plan):
    """Exclusive_Process lets one process have the GPU (a second one, a stray CUDA init in a
    DataLoader worker or every rank on cuda:0, fails); MIG splits it into instances NCCL cannot
    join."""
    problems = []
    for gpu in needed:
        if str(gpu.get("compute_mode") or "").lower() == "exclusive_process":
            problems.append(problem(
                host, "gpu compute mode", f"{_gpu(gpu)} shared (compute mode Default)",
                "Exclusive_Process: a second process on it fails",
                f"nvidia-smi -i {gpu.get('index')} -c DEFAULT as root where anything but one "
                "rank touches it"))
        if str(gpu.get("mig_mode") or "").lower() == "enabled":
            problems.append(problem(
                host, "mig", f"{_gpu(gpu)} whole (MIG off)", "MIG enabled",
                f"nvidia-smi -i {gpu.get('index')} -mig 0 as root (then reset the GPU); NCCL "
                "does not communicate between MIG instances"))
    return problems


def gpu_arch_ptx(host, f, needed, plan):
    """A GPU that the build has only PTX for: the driver compiles every kernel at its first
    launch (minutes, each process; cached in ~/.nv/ComputeCache)."""
    arch_list = f["torch"].get("arch_list") or []
    return [problem(host, "gpu arch", f"sm_{cap.replace('.', '')} kernels in torch "
                    f"{f['torch'].get('version')}", f"only PTX ({' '.join(arch_list)})",
                    "install a torch build with kernels for this GPU, or expect the first "
                    "steps to take minutes while the driver compiles")
            for cap in _caps(needed) if arch_list and arch_support(cap, arch_list) == "ptx"]


def duplicate(run):
    return duplicate_gpus(run.usable, run.backend)


CHECKS = (duplicate,)
# The refusals of the GPUs a node's processes use, for nccl jobs.
GPU_CHECKS = (gpu_busy, gpu_arch, cuda_driver, gpu_prohibited)
# The warnings of the GPUs a node's processes use, for nccl jobs.
GPU_WARNINGS = (persistence, gpu_memory_errors, xid_errors, gpu_sharing, gpu_arch_ptx)
# The refusals the job's preflight_warn may turn into warnings.
DOWNGRADABLE = ("gpu busy", "gpu arch", "cuda driver", "gpu compute mode")
