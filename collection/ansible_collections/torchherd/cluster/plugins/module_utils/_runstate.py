# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The run-state record: every fact about one node's part of a run, in one file (run.json in
the node's run directory), with one schema and one writer per transition.

Sections, and who writes them (nobody else does):

- job: the start (started_at as it spawns the supervisor; restart: the whole-job restart it
  is), the supervisor (supervisor as it detaches; launcher and pid once the launcher runs;
  first_output_at when a rank first wrote output; timed_out_at past the job's timeout; at the
  launcher's end exit_code and ended_at, once; standby where the job's restarts are torchrun's:
  used, launcher_exit, and standby_unneeded_at where the job did not need it; attempts where
  torchrun restarts the workers: started_at, output_at of each), stop (stopped_at as it begins,
  killed once done; exit_code and ended_at for a supervisor that never wrote them).
  The job's state on the node is derived from this section alone (job_state).
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

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic

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


# The job's facts that a file of the run directory repeats, derived from the record here and
# nowhere else (note_job). They stay for the readers that take the file: the gang's worker
# watch and the summary's root cause read `stopped` (its time), and the files are what a run
# directory written by an earlier version holds (_rundir's legacy_job reads those).
MARKERS = {"launcher": "pid", "supervisor": "supervisor", "exit_code": "exit_code",
           "stopped_at": "stopped", "timed_out_at": "timed_out",
           "standby_unneeded_at": "standby"}


def marker_text(field, value):
    """A marker file's content for the record's `field`: "pid start-time" for a process (see
    _rundir's running), else the value on a line."""
    if field in ("launcher", "supervisor"):
        return f"{value['pid']} {value['start']}"
    return f"{value}\n"


def note_job(paths, **fields):
    """One transition of the job section, and the marker files that repeat its facts: the
    record first, so that whoever finds a marker finds its fact in the record."""
    current = write(paths, "job", **fields)
    for field, value in fields.items():
        if field in MARKERS:
            write_atomic(os.path.join(paths["dir"], MARKERS[field]), marker_text(field, value))
    return current


def ended_state(job):
    """The job's state from its record's job section once the launcher's exit code is in it,
    else None: stopped, timed_out, standby (it waited for a lost node the job did not lose),
    succeeded or failed."""
    if job.get("exit_code") is None:
        return None
    if job.get("stopped_at") is not None:
        return "stopped"
    if job.get("timed_out_at") is not None:
        return "timed_out"
    if job.get("standby_unneeded_at") is not None:
        return "standby"
    return "succeeded" if int(job["exit_code"]) == 0 else "failed"


def job_state(job, alive, leftovers):
    """The job's state on this node from its record's job section: absent, running, the ended
    states (ended_state), lost (its supervisor died without writing the exit code: the node
    rebooted, the OOM killer, kill -9). `alive(process)`: whether a recorded process (pid and
    start time) still runs; `leftovers()`: whether processes of the job still run."""
    launcher = job.get("launcher")
    if launcher is None:
        # A start in the background: its supervisor waits at the barrier before the launcher.
        running = job.get("supervisor") is not None and alive(job["supervisor"]) \
            and job.get("exit_code") is None
        return {"state": "running" if running else "absent", "pid": None, "exit_code": None}
    pid = int(launcher["pid"])
    ended = ended_state(job)
    if ended is not None:
        return {"state": ended, "pid": pid, "exit_code": int(job["exit_code"])}
    if alive(launcher) or leftovers() or (job.get("supervisor") is not None
                                          and alive(job["supervisor"])):
        # Also when the launcher just ended and its supervisor is writing the exit code.
        return {"state": "running", "pid": pid, "exit_code": None}
    return {"state": "lost", "pid": pid, "exit_code": None}


def rules_open(record):
    """The firewall rules the record says are still in place on the node."""
    fw = record.get("firewall") or {}
    if not fw.get("rules"):
        return []
    if fw.get("closed_by") and not fw.get("error"):
        return []
    return list(fw["rules"])
