# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Who uses a node: the torchherd runs on it and the GPU processes that are none of theirs.

A run is found from what runs, not from a root: every process of a job carries its run
directory in its environment (_rundir's MARKER; the stale-job scan of preflight reads the same),
so the runs of every user and every controller show, whatever their torchherd root, as far as
the kernel lets this user read other users' environments (root reads them all). Each run is then
described from its run directory: the record's job section (its state, start, supervisor) and
the run's description in meta.json (host, node_rank, name), as status reads them."""

from __future__ import annotations

import os

from ansible_collections.torchherd.cluster.plugins.module_utils._gpus import read_gpus
from ansible_collections.torchherd.cluster.plugins.module_utils._proc import (
    process_user,
    read_stat,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    alive,
    all_runs_with_processes,
    load_json,
    read_state,
    recorded_job,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._torchprobe import NVIDIA_PROC

# The record's job states of a job that has ended (_runstate's ended_state), and of one whose
# supervisor died without writing its end.
ENDED = ("succeeded", "failed", "stopped", "timed_out", "standby", "lost")


def ps_state(job_state, supervisor_alive, has_dir=True):
    """What ps says of a run with live processes on the node, from the record's job state,
    whether its supervisor still runs (None: the record names none) and whether its run
    directory is there: running (watched by its supervisor), stale (its processes outlived the
    job's end, its run directory, or whoever watched them: the gang will not stop them nor will
    an exit code be written), starting (no launcher in the record yet: a start in progress, or
    a launcher preflight started ahead)."""
    if job_state in ENDED or not has_dir:
        return "stale"
    if job_state == "running":
        return "running" if supervisor_alive is not False else "stale"
    return "starting"


def gpu_index(gpus):
    """GPU uuid (without nvidia-smi's C(GPU-)) -> index, of _gpus.read_gpus' GPUs."""
    return {gpu["uuid"]: gpu["index"] for gpu in gpus or [] if gpu.get("uuid")}


def held(processes, pids, index):
    """(sorted GPU indices, memory bytes or None) that the processes `pids` hold, from
    nvidia-smi's processes (_gpus.parse_apps); ([], None) where none of them holds one."""
    mine = [p for p in processes or [] if p["pid"] in pids]
    gpus = sorted({index.get(p["gpu_uuid"], p["gpu_uuid"]) for p in mine},
                  key=lambda g: (isinstance(g, str), g))
    memory = [p["used_memory_bytes"] for p in mine if p.get("used_memory_bytes") is not None]
    return gpus, sum(memory) if memory else None


def describe(run_dir, pids, processes=None, index=None, user_of=process_user):
    """One run on this node, from its run directory and its live processes `pids`."""
    job = recorded_job(run_dir)
    meta = load_json(os.path.join(run_dir, "meta.json"), {})
    state = read_state({"dir": run_dir})
    supervisor = job.get("supervisor")
    gpus, memory = held(processes, set(pids), index or {})
    users = [u for u in (user_of(pid) for pid in pids) if u is not None]
    return {
        "run_id": os.path.basename(run_dir.rstrip("/")),
        "run_dir": run_dir,
        "name": meta.get("name"),
        "host": meta.get("host"),
        "node_rank": meta.get("node_rank"),
        "user": users[0] if users else None,
        "started_at": job.get("started_at"),
        "state": ps_state(state["state"], None if supervisor is None else alive(supervisor),
                          os.path.isdir(run_dir)),
        "job_state": state["state"],
        "exit_code": state["exit_code"],
        "pids": sorted(pids),
        "gpus": gpus if processes is not None else None,
        "gpu_memory_bytes": memory,
    }


def foreign(processes, ours, index, user_of=process_user):
    """The GPU processes that are no torchherd run's: pid, user (None where this node's /proc
    does not show the process: another container's), gpu (its index), used_memory_bytes,
    name. None where nvidia-smi could not say."""
    if processes is None:
        return None
    return [{"pid": p["pid"], "user": user_of(p["pid"]),
             "gpu": index.get(p["gpu_uuid"], p["gpu_uuid"]),
             "used_memory_bytes": p.get("used_memory_bytes"), "name": p.get("name")}
            for p in processes if p["pid"] not in ours]


def live(pids):
    """The pids that still run (zombies, and processes gone since the scan, left out)."""
    return [pid for pid in pids if (read_stat(pid) or {}).get("state") not in (None, "Z", "X")]


def mount_namespace(pid):
    """The mount namespace of process `pid` (/proc/<pid>/ns/mnt), or None where it cannot be
    read (gone, or another user's)."""
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def elsewhere(run_dir, pids, namespace_of=mount_namespace):
    """Whether a run belongs to a container on this machine, not to this node: its run
    directory is not on this node's file system and each of its processes is in another mount
    namespace (a node that is a container there answers for it). A run whose directory went
    while its processes run here is this node's (stale)."""
    if os.path.isdir(run_dir):
        return False
    own = namespace_of("self")
    spaces = [namespace_of(pid) for pid in pids]
    return own is not None and all(s is not None and s != own for s in spaces)


def node_runs(found=None, driver=None, proc=NVIDIA_PROC):
    """{runs, gpu_processes, sees_all} of this node: `found` (run dir -> pids, else the scan of
    every process) and `driver` (_gpus.read_gpus' answer, else asked now from `proc`)."""
    found = all_runs_with_processes() if found is None else found
    driver = read_gpus(proc) if driver is None else driver
    processes = (driver or {}).get("processes")
    index = gpu_index((driver or {}).get("gpus"))
    runs = []
    for run_dir, pids in sorted(found.items()):
        pids = live(pids)
        if pids and not elsewhere(run_dir, pids):
            runs.append(describe(run_dir, pids, processes, index))
    ours = {pid for run in runs for pid in run["pids"]}
    return {"runs": runs, "gpu_processes": foreign(processes, ours, index),
            "sees_all": os.geteuid() == 0}
