# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Run directory of a job on one node, and the processes that belong to it.

torchrun starts every worker in a session of its own, so a process group does not hold the
whole job. Every process of a job inherits TORCHHERD_RUN=<run dir> in its environment instead;
scanning /proc for it finds workers, their data loaders and anything they spawned.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._proc import (
    environs,
    proc_start_time,
    read_stat,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    MARKERS,
    job_state,
    read_record,
)

MARKER = "TORCHHERD_RUN"


def run_paths(root, run_id):
    run_dir = os.path.join(os.path.expanduser(root), "runs", run_id)
    return {
        "dir": run_dir,
        # These six repeat facts of the run-state record's job section (_runstate's MARKERS:
        # written with them by note_job, read by nothing here but legacy_job).
        "pid": os.path.join(run_dir, "pid"),
        # The supervisor that waits for torchrun and writes its end (it has no marker).
        "supervisor": os.path.join(run_dir, "supervisor"),
        "exit_code": os.path.join(run_dir, "exit_code"),
        "stopped": os.path.join(run_dir, "stopped"),
        "timed_out": os.path.join(run_dir, "timed_out"),
        # Where the node waited as a standby the job did not need (_supervisor).
        "standby": os.path.join(run_dir, "standby"),
        "log": os.path.join(run_dir, "node.log"),
        "cmd": os.path.join(run_dir, "cmd.json"),
        "env": os.path.join(run_dir, "env.json"),
        "meta": os.path.join(run_dir, "meta.json"),
        "torchrun_logs": os.path.join(run_dir, "torchrun"),
        # Touched by the job, where it wants (TORCHHERD_PROGRESS_FILE): progress without output.
        "progress": os.path.join(run_dir, "progress"),
        # Written once the job was declared hung: every node's wait then returns. Its time is
        # the record's hang.declared_at (_runstate's note_hang).
        "hung": os.path.join(run_dir, "hung"),
        # (run.json, the run-state record of the job, barrier, gang and firewall: _runstate.)
        # NCCL's Flight Recorder dumps and the pipes that ask for them (see _stacks).
        "flight_recorder": os.path.join(run_dir, "flight_recorder"),
    }


def read_text(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except OSError:
        return None


def running(pid, start):
    """Whether process `pid`, started at `start` (proc_start_time), still runs: not a reused
    pid, and not a zombie. A process that has exited stays in /proc, with its start time, until
    its parent reaps it; a daemon's parent after a double fork (init, or a container's first
    process) may take a second or more to, and the job has ended by then."""
    stat = read_stat(pid)
    return stat is not None and stat["start_time"] == start and stat["state"] not in ("Z", "X")


def job_pids(run_dir):
    """Pids of every live process carrying this run's marker (zombies excluded)."""
    wanted = f"{MARKER}={run_dir}".encode()
    found = []
    for pid, environ in environs(skip=os.getpid()):
        if wanted not in environ:
            continue
        stat = read_stat(pid)
        if stat is not None and stat["state"] != "Z":
            found.append(pid)
    return sorted(found)


def all_runs_with_processes():
    """Run dirs of every job with live processes on this node (for stale-job checks)."""
    runs = {}
    prefix = f"{MARKER}=".encode()
    for pid, environ in environs():
        for item in environ:
            if item.startswith(prefix):
                runs.setdefault(item[len(prefix):].decode(errors="replace"), []).append(pid)
    return runs


def alive(process):
    """Whether a process the record names ({"pid", "start"}) still runs (running)."""
    return running(int(process["pid"]), process["start"])


def recorded_job(run_dir):
    """The job section of the run's record in `run_dir` (a node's, or collect's copy of it).
    A run directory an earlier version wrote has no `supervisor` there: its marker files
    (legacy_job) give the facts then, over what its record has."""
    job = read_record({"dir": run_dir}).get("job") or {}
    return job if "supervisor" in job else dict(job, **legacy_job(run_dir))


def legacy_job(run_dir):
    """Backward compatibility, for run directories written before the record held the job's
    state (a run started before an upgrade, its status, stop and prune after it): the job
    facts from their marker files (see _runstate's MARKERS), the start and end times from
    meta.json, an end time written by nobody from the exit code file's change time."""
    job = {}
    for field, name in MARKERS.items():
        text = read_text(os.path.join(run_dir, name))
        if text is None:
            continue
        if field in ("launcher", "supervisor"):
            pid, _sep, start = text.partition(" ")
            if pid.isdigit():
                job[field] = {"pid": int(pid), "start": start}
        elif field == "exit_code":
            if text.lstrip("-").isdigit():
                job[field] = int(text)
        else:
            job[field] = _number(text)
    meta = load_json(os.path.join(run_dir, "meta.json"), {})
    job.update({key: meta[key] for key in ("started_at", "ended_at") if key in meta})
    if "exit_code" in job and job.get("ended_at") is None:
        try:
            job["ended_at"] = os.path.getmtime(os.path.join(run_dir, MARKERS["exit_code"]))
        except OSError:
            pass
    return job


def _number(text):
    try:
        return float(text)
    except ValueError:
        return text  # an empty marker: its presence was the fact


def read_state(paths):
    """State of the job on this node (absent, running, succeeded, failed, stopped, timed_out,
    standby, lost: _runstate's job_state), from its run-state record alone."""
    job = recorded_job(paths["dir"])
    for _look in range(3):
        state = job_state(job, alive, lambda: bool(job_pids(paths["dir"])))
        if state["state"] not in ("absent", "lost"):
            return state
        # The supervisor may have written the launcher's pid, or its end, and gone during
        # the looks at the processes: a record that changed since is read again.
        again = recorded_job(paths["dir"])
        if again == job:
            return state
        job = again
    return state


# Once the workers are gone, the launcher (torchrun, or the wrapper) holds nothing of the
# user's: it gets this long to end by itself, not the whole grace. torchrun signalled while it
# handles its workers' own failure can stay in its exit until killed.
LAUNCHER_GRACE = 2.0


def terminate(run_dir, pgid, grace):
    """SIGTERM torchrun's group (it forwards to its workers), then SIGKILL whatever is left
    after the grace (or LAUNCHER_GRACE after the last worker ended).

    Only the first of several stoppers (the gang, the controller's stop, a timeout) sends the
    SIGTERM: a second one, in the middle of torchrun's own shutdown, can leave it hanging. The
    others wait for the same grace and kill what is left."""
    try:
        os.close(os.open(os.path.join(run_dir, "terminating"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640))
        first = True
    except FileExistsError:
        first = False
    except OSError:
        first = True
    if first:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    now = time.monotonic()
    deadline = now + grace
    launcher_only = None
    while now < deadline:
        left = job_pids(run_dir)
        if not left:
            break
        if set(left) <= {pgid}:
            launcher_only = launcher_only or now
            if now - launcher_only >= LAUNCHER_GRACE:
                break
        else:
            launcher_only = None
        time.sleep(0.1)
        now = time.monotonic()
    killed = []
    for _attempt in range(50):
        left = job_pids(run_dir)
        if not left:
            break
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    return sorted(set(killed))


def last_activity(paths):
    """When the job last showed progress on this node (this node's clock): the newest of its
    node log (every rank's output, teed there by the launcher) and the progress file."""
    times = []
    for key in ("log", "progress"):
        try:
            times.append(os.path.getmtime(paths[key]))
        except OSError:
            pass
    return max(times) if times else None


def load_json(path, default=None):
    text = read_text(path)
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


# The launcher's own banner, which torchrun prints as its workers start (a line of stars around
# its OMP_NUM_THREADS notice), after a logging prefix such as "W1128 10:00:00.123000 4242
# .../run.py:793] ": it says nothing of the job, and a job that prints little would show it as
# its last line.
_BANNER = re.compile(r"^(?:[IWEF]\d{4} [\d:.]+ \d+ \S+\] )?(?:\*+|Setting OMP_NUM_THREADS "
                     r"environment variable for each process .*)$")


def last_line(path):
    """Last non-empty line of a log (read from its last 4 KiB) that is not the launcher's
    banner, or ""."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 4096))
            lines = [ln for ln in handle.read().decode(errors="replace").splitlines()
                     if ln.strip() and not _BANNER.match(ln.strip())]
    except OSError:
        return ""
    return lines[-1] if lines else ""


# Lines in a node log that are not the job's own words, for its live line (job_line): the
# supervisor's own ("torchherd: ..."), Python's warnings (the "UserWarning: ..." line and the
# source line after it), glog-style lines of torch's C++ side, Python logging of
# torch.distributed, and the launcher's logging (DeepSpeed's "[date] [INFO] [launch.py:..]").
# The driver filters the lines it is given the same way (its progress view's _NOT_JOB): it
# imports nothing from the collection.
_NOT_JOB = re.compile(r"^torchherd: |\w*Warning: |^\s*warnings\.warn\(|^\[?[WIEF]\d{4} "
                      r"|^(WARNING|INFO|DEBUG):torch\.|^\[[\d-]+ [\d:,.]+\] \[[A-Z]+\] ")
# A rank's line as torchrun and accelerate tee it ("[default<local rank>]:").
_RANK_PREFIX = re.compile(r"^\[default\d+\]:")


def job_line(path):
    """The job's own last words in a node log (its last 4 KiB), for a live view: the last line
    a rank printed, else the last line that is neither the launcher's banner nor a warning or
    log line of torch, the launcher or the supervisor (a DeepSpeed job's ranks print without a
    prefix); "" where there is none."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            start = max(0, handle.tell() - 4096)
            handle.seek(start)
            lines = handle.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    if start:
        lines = lines[1:]  # the window's first line may begin mid-line
    kept = [ln.strip() for ln in lines if ln.strip() and not _BANNER.match(ln.strip())
            and not _NOT_JOB.search(_RANK_PREFIX.sub("", ln.strip(), count=1))]
    ranks = [ln for ln in kept if _RANK_PREFIX.match(ln)]
    return (ranks or kept or [""])[-1]


def stop_asked(paths):
    """Whether a stop of the job here began (the record's stopped_at)."""
    return recorded_job(paths["dir"]).get("stopped_at") is not None


def supervisor_alive(paths):
    """Whether the job's supervisor still runs (on the master: until every node of the gang
    said its launcher ended, see _gang)."""
    supervisor = recorded_job(paths["dir"]).get("supervisor")
    return supervisor is not None and alive(supervisor)


def sleep_until_gone(paths, seconds, which="launcher"):
    """Sleep until torchrun (or its wrapper; `which` "supervisor": the supervisor, as the
    record names them) exits, or for `seconds`.

    A pidfd turns readable when the process exits, so a job watched for days costs the node
    nothing; without one (Python 3.8, kernels before 5.3), or once the process is gone and the
    supervisor is still writing the exit code, this sleeps a fraction of a second."""
    process = recorded_job(paths["dir"]).get(which) or {}
    pid, start = str(process.get("pid", "")), process.get("start")
    pidfd_open = getattr(os, "pidfd_open", None)
    fd = None
    if pid.isdigit() and pidfd_open is not None:
        try:
            fd = pidfd_open(int(pid))
        except OSError:
            fd = None
    try:
        # A pid reused by another process since torchrun's start would never tell us anything.
        if fd is not None and proc_start_time(int(pid)) == start:
            select.select([fd], [], [], seconds)
        else:
            time.sleep(min(seconds, 0.25))
    finally:
        if fd is not None:
            os.close(fd)
