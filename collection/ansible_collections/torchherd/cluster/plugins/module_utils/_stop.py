# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Stopping a job on one node so that nothing of it remains: SIGTERM, a grace period, then
SIGKILL to every process that carries the run's marker (see _rundir)."""

from __future__ import annotations

import os
import signal
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._container import remove
from ansible_collections.torchherd.cluster.plugins.module_utils._proc import read_stat
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    job_pids,
    load_json,
    recorded_job,
    terminate,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import note_job


def stop(paths, pid, grace):
    """Ends the job whose torchrun (or wrapper) is `pid` (None if it never started); returns
    the pids that needed SIGKILL."""
    note_job(paths, stopped_at=time.time())
    if pid and load_json(paths["meta"], {}).get("wrapper"):
        _stop_wrapped(paths["dir"], pid, grace)
    killed = terminate(paths["dir"], pid, grace) if pid else []
    for left in job_pids(paths["dir"]):
        try:
            os.kill(left, signal.SIGKILL)
        except ProcessLookupError:  # ended between the listing and the kill
            pass
    container = load_json(paths["meta"], {}).get("container")
    if container:
        # Its processes are gone (they carry the marker); a container whose runtime did not
        # see its end (its monitor killed with it) goes now.
        remove(container, container["name"])
    # The supervisor writes the end once torchrun is reaped; one that is gone never will.
    deadline = time.monotonic() + 5
    while _unended(paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _unended(paths):
        note_job(paths, exit_code=-signal.SIGKILL, ended_at=time.time())
    return killed


def _unended(paths):
    return recorded_job(paths["dir"]).get("exit_code") is None


def _stop_wrapped(run_dir, wrapper_pid, grace):
    """SIGTERM torchrun itself, then wait up to grace for it and its workers to end.

    Under a wrapper, the pid is the wrapper's, and srun answers SIGTERM by killing its step
    at once; torchrun runs outside the wrapper's process group (under slurmstepd), the only
    process of the job whose parent is not one of the job's."""
    def outside():
        found = {}
        for pid in job_pids(run_dir):
            stat = read_stat(pid)
            if stat is not None and stat["pgrp"] != wrapper_pid:
                found[pid] = stat["ppid"]
        return found

    procs = outside()
    for pid, parent in procs.items():
        if parent not in procs:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and outside():
        time.sleep(0.1)
