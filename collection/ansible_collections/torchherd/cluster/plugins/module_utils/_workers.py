# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The supervisor's worker watch: a launcher's ranks found in /proc, each watched with a pidfd,
so that a failed worker stops the gang before its launcher has handled the failure."""

from __future__ import annotations

import os
import select
import subprocess

from ansible_collections.torchherd.cluster.plugins.module_utils._proc import read_stat
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    LAUNCHER_GRACE,
    stop_asked,
    terminate,
)

# os.pidfd_open: Python 3.9 and later (the nodes' Python may be 3.8).
_PIDFD_OPEN = getattr(os, "pidfd_open", None)
# Whether this node can watch the workers (else the launcher's exit tells the gang).
WORKER_WATCH = _PIDFD_OPEN is not None


def watch_workers(proc, paths, grace, gang, name, running, say):
    """The moment a worker of the launcher ends with an error, tell the gang (the other nodes
    stop now, not once this launcher has handled the failure and ended), and end the launcher
    if it has not ended LAUNCHER_GRACE s later. The kernel wakes this thread at the worker's
    exit (a pidfd per worker); the exit code is the zombie's, read before the launcher reaps
    it, which it does at its next look (torchrun: every 0.1 s). A worker the launcher reaped
    first is left to the launcher's own exit. Workers are found once a second: the children
    whose environment names their LOCAL_RANK (torchrun, accelerate and DeepSpeed set it); any
    other child of the launcher is no rank."""
    poller = select.poll()
    watched = {}
    while proc.poll() is None:
        for pid in _children(proc.pid):
            if pid in watched.values() or not _is_rank(pid):
                continue
            try:
                fd = _PIDFD_OPEN(pid)
            except OSError:
                continue
            watched[fd] = pid
            poller.register(fd, select.POLLIN)
        for fd, _event in poller.poll(1000):
            pid = watched.pop(fd)
            poller.unregister(fd)
            code = _zombie_code(pid)
            os.close(fd)
            if code and proc.poll() is None and not stop_asked(paths):
                running["worker_code"] = code
                say(f"a worker (pid {pid}) ended with exit code {code}: the other nodes are "
                    f"told to stop")
                gang.worker_failed(code, name)
                try:
                    proc.wait(LAUNCHER_GRACE)
                except subprocess.TimeoutExpired:
                    terminate(paths["dir"], proc.pid, grace)
                return


def _is_rank(pid):
    """Whether a process is a rank: LOCAL_RANK in its environment (a child not yet through its
    exec is looked at again a second later)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return any(item.startswith(b"LOCAL_RANK=") for item in handle.read().split(b"\0"))
    except OSError:
        return False


def _children(pid):
    """Pids of a process's children (its main thread's: where a launcher starts its workers)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="utf-8") as handle:
            return [int(child) for child in handle.read().split()]
    except (OSError, ValueError):
        return []


def _zombie_code(pid):
    """The exit code of an ended, not yet reaped process (negative: the signal that ended it);
    None once it is reaped."""
    found = read_stat(pid)
    if found is None or found["state"] != "Z" or found["exit_status"] is None:
        return None
    status = found["exit_status"]
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF
