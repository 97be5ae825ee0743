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
- gang: the master's supervisor (joined, expected, lost, lost_at, error; lines, every node's
  last line of the job as the gang heard it: name -> last_line, at, written at most once a
  second while they change, see _gang).
- firewall: the start where it opened the rules (opened_by "start", rules, backends:
  rules_opened), the supervisor or the wait that removed them (closed_by, changed, error:
  rules_closed). The firewall role's module (firewall_rules with run_dir) the same way, under
  become as root: opened_by "role" (and a removal written before cleared), closed_by
  "teardown" with the rules it removed. What root writes in the job user's run directory is
  that user's (_make_dir, _replace).
- hang: the wait's hang watch, each time it returns (timeout, quiet_since, last: the node's last
  progress on its clock, quiet, quiet_for, noted_at; declared_at once the job was declared
  hung, which the `hung` file repeats: note_hang); the stop and the supervisor's end, for a
  declared hang no wait saw (declared_at: hang_seen).
- use: the supervisor's samples of the node's GPUs, CPU and memory while the launcher runs,
  at the schedule's start.sample_every (every, per, step, gpus, gpu_memory_total_mib,
  memory_total_mib, points, recent: _use), bounded for a job of any length.

Every write bumps `seq` (the controller takes the newest of the copies it has: the modules'
answers and the file collect brings back; a whole-job restart's fresh record goes on from the
kept one's: carry_over) and `updated_at` (the node's clock). Writers in
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
SECTIONS = ("job", "barrier", "gang", "firewall", "hang", "use")

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
    owner = _make_dir(paths)
    with _THREADS:
        fd = os.open(os.path.join(paths["dir"], f".{RECORD}.lock"),
                     os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o640)
        try:
            if owner is not None:
                # Else the job's user could not open the lock root created, nor write again.
                os.fchown(fd, *owner)
            fcntl.flock(fd, fcntl.LOCK_EX)
            current = read_record(paths)
            current.setdefault(section, {}).update(fields)
            current["seq"] = int(current.get("seq") or 0) + 1
            current["updated_at"] = time.time()
            _replace(record_path(paths), json.dumps(current, sort_keys=True), owner)
        finally:
            os.close(fd)
    return current


def carry_over(paths, earlier):
    """The fresh record of a whole-job restart, whose ended run was kept aside with its record
    `earlier` (_supervisor's keep_ended_run): its seq goes on from the earlier one, since the
    controller may hold copies of that one from this launch (the firewall role's, written
    before the start moved it) and takes the highest; and firewall rules still in place on the
    node stay in it, where the teardown finds them."""
    with _THREADS:
        current = empty()
        current["seq"] = int(earlier.get("seq") or 0) + 1
        current["updated_at"] = time.time()
        if rules_open(earlier):
            current["firewall"] = dict(earlier["firewall"])
        owner = _make_dir(paths)
        _replace(record_path(paths), json.dumps(current, sort_keys=True), owner)
    return current


# A writer as root in a run directory of another user: the firewall role's module, which runs
# with become while the job's user owns the run directory (the start made it, or will). What it
# writes there is the directory's owner's, so that the job's own writers (the start, the
# supervisor, the wait, the stop) go on writing the record and its lock as before.

def _make_dir(paths):
    """The run directory, made where missing (each new level owned as the one above it, where
    root makes it); the owner that root's files there must get, else None."""
    run_dir = paths["dir"]
    if os.geteuid() != 0:
        os.makedirs(run_dir, exist_ok=True)
        return None
    missing = []
    here = run_dir
    while not os.path.isdir(here) and os.path.dirname(here) != here:
        missing.append(here)
        here = os.path.dirname(here)
    above = os.stat(here)
    for level in reversed(missing):
        try:
            os.mkdir(level)
        except FileExistsError:
            continue
        if above.st_uid != 0:
            os.chown(level, above.st_uid, above.st_gid, follow_symlinks=False)
    if os.path.islink(run_dir):
        # Root writes nothing where another user's link would lead it.
        raise OSError(f"run-state record: {run_dir} is a symbolic link, not written as root")
    found = os.stat(run_dir)
    return None if found.st_uid == 0 else (found.st_uid, found.st_gid)


def _replace(path, text, owner):
    """`text` in place of `path`, as write_atomic puts it; where root writes a run directory of
    another user (`owner`), the file is that user's before it is in place, and made afresh (a
    link another user left at its name is not followed)."""
    if owner is None:
        write_atomic(path, text)
        return
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(tmp, flags, 0o644)
    except FileExistsError:  # left by a writer of the same pid that died
        os.unlink(tmp)
        fd = os.open(tmp, flags, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        os.fchown(handle.fileno(), *owner)
    os.replace(tmp, path)


# The job's facts that a file of the run directory repeats, derived from the record here and
# nowhere else (note_job). Every reader of this version reads the record; the files are what a
# run directory written by an earlier version holds (_rundir's legacy_job reads those), and
# what a user's own script may look at (`cat runs/ID/exit_code`).
MARKERS = {"launcher": "pid", "supervisor": "supervisor", "exit_code": "exit_code",
           "stopped_at": "stopped", "timed_out_at": "timed_out",
           "standby_unneeded_at": "standby"}


# The file that says the job was declared hung (its time), repeating the hang section's
# declared_at (note_hang).
HUNG = "hung"


def marker_text(field, value):
    """A marker file's content for the record's `field`: "pid start-time" for a process (see
    _rundir's running), else the value on a line."""
    if field in ("launcher", "supervisor"):
        return f"{value['pid']} {value['start']}"
    return f"{value}\n"


def note_job(paths, **fields):
    """One transition of the job section, and the marker files that repeat its facts: the
    markers first, then the record: a user's script that finds a fact in the record (the job's
    end, its stop) and then looks at the marker that repeats it finds the marker in place. A marker ahead of
    the record says nothing the record will not say a moment later: read_state reads the
    record alone, and legacy_job takes the markers only where the record has no supervisor,
    where they repeat the same values."""
    owner = _make_dir(paths)
    for field, value in fields.items():
        if field in MARKERS:
            _replace(os.path.join(paths["dir"], MARKERS[field]),
                     marker_text(field, value), owner)
    return write(paths, "job", **fields)


def note_hang(paths, **fields):
    """One word of the hang watch into the record's hang section; a declared hang
    (`declared_at`) also in the run directory's `hung` file, which ends every node's wait
    (written first, as note_job writes its markers: whoever finds the record's declaration
    finds the file)."""
    owner = _make_dir(paths)
    if fields.get("declared_at") is not None:
        hung, text = os.path.join(paths["dir"], HUNG), f"{fields['declared_at']}\n"
        try:
            with open(hung, encoding="utf-8") as handle:
                same = handle.read().strip() == text.strip()
        except OSError:
            same = False
        if not same:
            _replace(hung, text, owner)
    return write(paths, "hang", **fields)


def declared_hang(paths):
    """The time in the run directory's `hung` file (the hang declared, as job_stacks' mark_hung
    writes it), or None where there is none; the file's text where it holds no time."""
    try:
        with open(os.path.join(paths["dir"], HUNG), encoding="utf-8") as handle:
            text = handle.read().strip()
    except OSError:
        return None
    try:
        return float(text)
    except ValueError:
        return text  # an empty file: the declaration was the fact


def hang_seen(paths):
    """The declared hang (the `hung` file that job_stacks' mark_hung writes) into the record
    where no wait has written it yet: the stop and the supervisor's end call this, so that a
    job stopped for its hang has the declaration in its record before its end."""
    declared = declared_hang(paths)
    if declared is not None and "declared_at" not in (read_record(paths).get("hang") or {}):
        note_hang(paths, declared_at=declared)


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


def rules_opened(by, opened):
    """The firewall section's fields for rules that `by` (start, role) opened, from what
    converge_rules returned: one shape whoever opened them."""
    return {"opened_by": by, "rules": list(opened.get("rules") or []),
            "backends": list(opened.get("backends") or [])}


def rules_closed(by, closed):
    """The firewall section's fields for a removal by `by` (supervisor, wait, teardown), from
    what close_rules (or converge_rules with state absent) returned: whether it changed the
    firewall, and its error (null where none: rules_open takes the rules as gone then)."""
    return {"closed_by": by, "changed": bool(closed.get("changed")), "error": closed.get("error")}


def rules_open(record):
    """The firewall rules the record says are still in place on the node."""
    fw = record.get("firewall") or {}
    if not fw.get("rules"):
        return []
    if fw.get("closed_by") and not fw.get("error"):
        return []
    return list(fw["rules"])
