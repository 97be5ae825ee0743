"""A node's job state from its run directory: running, ended, or lost."""

import os
import subprocess

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    proc_start_time,
    read_state,
    run_paths,
    write_atomic,
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
