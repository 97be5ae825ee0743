"""A node's job state from its run directory: running, ended, or lost."""

import os
import subprocess
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic
from ansible_collections.torchherd.cluster.plugins.module_utils._proc import proc_start_time
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    read_state,
    run_paths,
    sleep_until_gone,
    supervisor_alive,
)


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def stamp(pid):
    return f"{pid} {proc_start_time(pid)}"


def test_torchrun_gone_without_exit_code_is_lost(tmp_path):
    paths = run_paths(str(tmp_path), "r")
    os.makedirs(paths["dir"])
    write_atomic(paths["pid"], f"{dead_pid()} 12345")
    assert read_state(paths)["state"] == "lost"


def test_torchrun_gone_while_its_supervisor_writes_the_exit_code_is_still_running(tmp_path):
    paths = run_paths(str(tmp_path), "r")
    os.makedirs(paths["dir"])
    write_atomic(paths["pid"], f"{dead_pid()} 12345")
    write_atomic(paths["supervisor"], stamp(os.getpid()))
    assert read_state(paths)["state"] == "running"


def test_a_reused_supervisor_pid_does_not_count(tmp_path):
    paths = run_paths(str(tmp_path), "r")
    os.makedirs(paths["dir"])
    write_atomic(paths["pid"], f"{dead_pid()} 12345")
    write_atomic(paths["supervisor"], f"{os.getpid()} 1")  # this pid, another start time
    assert read_state(paths)["state"] == "lost"


def test_exit_code_decides_once_written(tmp_path):
    paths = run_paths(str(tmp_path), "r")
    os.makedirs(paths["dir"])
    write_atomic(paths["pid"], stamp(os.getpid()))
    write_atomic(paths["exit_code"], "1\n")
    assert read_state(paths) == {"state": "failed", "pid": os.getpid(), "exit_code": 1}


def test_an_exited_supervisor_not_yet_reaped_has_ended(tmp_path):
    """A zombie keeps its /proc entry and start time until its parent reaps it (a daemon's
    parent after a double fork may take seconds): the master's wait for its gang must not spin
    until then, nor count the job as running."""
    paths = run_paths(str(tmp_path), "r")
    os.makedirs(paths["dir"])
    proc = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while proc_start_time(proc.pid) is not None and time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat", encoding="utf-8") as handle:
            if handle.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.01)
    try:
        write_atomic(paths["supervisor"], stamp(proc.pid))  # exited, not reaped: a zombie
        write_atomic(paths["pid"], f"{dead_pid()} 12345")
        assert not supervisor_alive(paths)
        assert read_state(paths)["state"] == "lost"
        started = time.monotonic()
        sleep_until_gone(paths, 5.0, which="supervisor")
        assert time.monotonic() - started < 1.0
    finally:
        proc.wait()


def test_a_live_supervisor_counts(tmp_path):
    paths = run_paths(str(tmp_path), "r")
    os.makedirs(paths["dir"])
    write_atomic(paths["supervisor"], stamp(os.getpid()))
    assert supervisor_alive(paths)


def test_an_exit_code_written_while_the_state_is_read_is_not_lost(tmp_path, monkeypatch):
    """The supervisor writes the exit code and ends between the first look (no exit code yet)
    and the looks for anything alive: the job ended, it was not lost."""
    from ansible_collections.torchherd.cluster.plugins.module_utils import _rundir

    paths = run_paths(str(tmp_path), "r")
    os.makedirs(paths["dir"])
    write_atomic(paths["pid"], f"{dead_pid()} 12345")
    write_atomic(paths["supervisor"], f"{dead_pid()} 12345")

    def scan_while_it_ends(run_dir):
        write_atomic(paths["exit_code"], "0\n")
        return []

    monkeypatch.setattr(_rundir, "job_pids", scan_while_it_ends)
    assert read_state(paths)["state"] == "succeeded"
