# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The detached supervisor of the job on one node: it leaves the module's session and output,
meets the other nodes (in the background), starts the launcher, watches it and waits for it,
and writes the job's end (ending)."""

from __future__ import annotations

import os
import subprocess
import threading
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._proc import proc_start_time
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    stop_asked,
    terminate,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import note_job
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record
from ansible_collections.torchherd.cluster.plugins.module_utils._stop import stop
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.ending import finish
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.meeting import (
    join,
    meet,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.nodelog import say
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.output import (
    first_output,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.standby import (
    wait_standby,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._use import Sampler
from ansible_collections.torchherd.cluster.plugins.module_utils._warm import claim
from ansible_collections.torchherd.cluster.plugins.module_utils._workers import (
    WORKER_WATCH,
    watch_workers,
)


class CalledOff(Exception):
    """The background barrier did not say go (or the job was stopped before the start)."""


def supervise(argv, env, cwd, paths, timeout, grace, meeting=None, close=None, rank_logs=True,
              stdin=None, restarts=False, warm=False, sample_every=0.0):
    """Runs in the detached grandchild: (the barrier and the gang, in the background), start
    torchrun, wait, (remove the firewall rules the start opened), write the exit code.
    `stdin`: what the launcher reads first on its standard input (the secrets, for a launcher
    in the job's image), else it reads nothing. `warm`: the launcher may have been started
    ahead (_warm): it is handed the start, else (none there) started anew. `sample_every`:
    seconds between two samples of the node's use into the record while the launcher runs
    (_use; 0: none)."""
    met = _detach(paths, meeting)
    # From here file descriptor 1 is the node log, no longer the module's result (see say).
    code = 127
    gang = None
    running = {}

    def stop_here(why):
        """The gang's stop: this node's job, as stop would (only while it runs)."""
        if not stop_asked(paths):
            say(f"stopping: {why}")
        proc = running.get("proc")
        if proc is None:
            note_job(paths, stopped_at=time.time())  # before the start: none
        elif proc.poll() is None:
            stop(paths, proc.pid, grace)

    try:
        if met:
            gang = join(meeting, met.get("sock"), met.get("port"), stop_here, paths)
        elif meeting is not None:
            gang, why = meet(meeting, paths, stop_here)
            if gang is None or stop_asked(paths):
                raise CalledOff(why or "stopped before the start")
        if not wait_standby(paths):
            raise CalledOff("stopped before the start")
        said_before = os.fstat(1).st_size  # the node log: what follows is the launcher's
        proc = _start_launcher(argv, env, cwd, paths, stdin, warm)
        running["proc"] = proc
        _launcher_is(paths, proc.pid)
        # Where torchrun restarts the workers itself, each attempt's first output too.
        running["first_output"] = threading.Thread(target=first_output, daemon=True, args=(
            proc, paths, paths["torchrun_logs"] if rank_logs else None, said_before),
            kwargs={"attempts": restarts})
        running["first_output"].start()
        if sample_every > 0:
            running["sampler"] = Sampler(
                sample_every, lambda use: record(paths, "use", **use)).start()
        # (pidfd: Linux 5.3 and Python 3.9; elsewhere the launcher's exit tells the gang.)
        if gang is not None and meeting.get("watch_workers") and WORKER_WATCH:
            threading.Thread(target=watch_workers, daemon=True,
                             args=(proc, paths, grace, gang, meeting["name"], running,
                                   say)).start()
        code = _wait(proc, paths, timeout, grace)
    except CalledOff as exc:
        why = str(exc)  # the barrier's own words may say it already
        say(why if why.startswith("the start was called off") else
            f"the start was called off: {why}")
        _launcher_is(paths, os.getpid())
        code = 1
    except OSError as exc:
        say(f"cannot start torchrun: {exc}")
        _launcher_is(paths, os.getpid())
    finally:
        if running.get("sampler") is not None:
            running["sampler"].stop()
        finish(paths, code, running, gang, meeting, warm, close)
        os._exit(0)


def _detach(paths, meeting):
    """A session of its own (the SSH session's end does not reach it), its pid written, the
    node log for its output, and none of the files the module had open but the master's gang
    socket from the barrier in the start's own call; that gang's way in ("met"), if any."""
    os.setsid()
    note_job(paths, supervisor=_process(os.getpid()))
    devnull = os.open(os.devnull, os.O_RDWR)
    log = os.open(paths["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    met = (meeting or {}).get("met")
    kept = met["sock"].fileno() if met and met.get("sock") is not None else None
    if kept is None:
        os.closerange(3, 65536)
    else:
        os.closerange(3, kept)
        os.closerange(kept + 1, 65536)
    return met


def _start_launcher(argv, env, cwd, paths, stdin, warm):
    """The launcher: the one started ahead where there is one (warm), else started anew;
    `stdin` written to it first."""
    proc = None
    if warm and not stdin:
        # The launcher started ahead in preflight, where the schedule said so (_warm).
        proc, seen = claim(paths["dir"], argv, env, cwd, paths["log"])
        record(paths, "job", warm=seen)
    if proc is None:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True,
                                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                stdout=1, stderr=2, close_fds=True)
    if stdin:
        try:
            proc.stdin.write(stdin.encode())
            proc.stdin.close()
        except OSError:
            pass  # the launcher is gone already: its exit code says why
    return proc


def _wait(proc, paths, timeout, grace):
    """The launcher's exit code; past `timeout` s (0: none) the job is stopped first."""
    try:
        return proc.wait(timeout=timeout or None)
    except subprocess.TimeoutExpired:
        note_job(paths, timed_out_at=time.time())
        say(f"job timed out after {timeout} s; stopping it")
        terminate(paths["dir"], proc.pid, grace)
        return proc.wait()


def _process(pid):
    """A process as the record names it: its pid and start time (see _rundir's running)."""
    return {"pid": pid, "start": proc_start_time(pid)}


def _launcher_is(paths, pid):
    """The launcher's process in the record (the supervisor's own where none started: the
    job's end is then its)."""
    note_job(paths, launcher=_process(pid), pid=pid)
