# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The run-state record: every fact about one node's part of a run, in one file (run.json in
the node's run directory), with one schema and one writer per transition.

Sections, and who writes them (nobody else does):

- job: the start (started_at, pid, restart: the whole-job restart it is), the supervisor
  when a rank first wrote output (first_output_at) and at the launcher's end (exit_code,
  ended_at; standby where the job's restarts are torchrun's: used, launcher_exit; attempts
  where torchrun restarts the workers: started_at, output_at of each), stop (stopped_at,
  killed).
- barrier: the start, where the barrier ran in its call, or the supervisor, where it ran in the
  background (where, go, and what the barrier saw: served, expect, error).
- gang: the master's supervisor (joined, expected, lost, lost_at, error).
- firewall: the start where it opened the rules (opened_by "start", rules), the supervisor or
  the wait that removed them (closed_by, removed, error). The firewall role's own rules run
  under become (another user, another home): the controller reads those from the role's
  results (filter run_state).

Every write bumps `seq` (the controller takes the newest of the copies it has: the modules'
answers and the file collect brings back) and `updated_at` (the node's clock). Writers in
several processes and threads (the module, the supervisor, the gang's stop) take a lock on the
run directory for the read-modify-write."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import write_atomic

RECORD = "run.json"
SCHEMA = 1
SECTIONS = ("job", "barrier", "gang", "firewall")

_THREADS = threading.Lock()


def record_path(paths):
    return os.path.join(paths["dir"], RECORD)


def empty():
    return {"schema": SCHEMA, "seq": 0, "updated_at": None, **{name: {} for name in SECTIONS}}


def read_record(paths):
    """The node's record as it is now (an empty one where nothing was written yet)."""
    try:
        with open(record_path(paths), encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return empty()
    return found if isinstance(found, dict) else empty()


def write(paths, section, **fields):
    """One transition: merge `fields` into `section` of the record; returns the whole record."""
    if section not in SECTIONS:
        raise ValueError(f"run-state record: no section {section!r} (one of {SECTIONS})")
    os.makedirs(paths["dir"], exist_ok=True)
    with _THREADS:
        fd = os.open(os.path.join(paths["dir"], f".{RECORD}.lock"), os.O_WRONLY | os.O_CREAT,
                     0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            current = read_record(paths)
            current.setdefault(section, {}).update(fields)
            current["seq"] = int(current.get("seq") or 0) + 1
            current["updated_at"] = time.time()
            write_atomic(record_path(paths), json.dumps(current, sort_keys=True))
        finally:
            os.close(fd)
    return current


def rules_open(record):
    """The firewall rules the record says are still in place on the node."""
    fw = record.get("firewall") or {}
    if not fw.get("rules"):
        return []
    if fw.get("closed_by") and not fw.get("error"):
        return []
    return list(fw["rules"])
