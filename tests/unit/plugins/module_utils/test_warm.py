"""The warm launcher over real processes: started ahead, claimed by the start, or not there and
the launcher started anew."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from test_supervisor import ended, log_text, params

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    MARKER,
    job_pids,
    read_state,
    run_paths,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import read_record
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor import spawn
from ansible_collections.torchherd.cluster.plugins.module_utils._warm import (
    claim,
    dismiss,
    socket_name,
    start_warm,
)

# A launcher module: says what it sees and ends with the code its first argument names. Run as
# __main__ its own code runs again (as python -m runs it); what it imports (warmdep, torch for
# torchrun) is already there where it was imported ahead, and only there.
DEP = "print('warmdep imported')\nVALUE = 1\n"
DEMO = """
import os, sys, time
AHEAD = "warmdep" in sys.modules
import warmdep
if __name__ == "__main__":
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "greeting", os.environ.get("GREETING"),
          "token", os.environ.get("TOKEN"), "imported_before", AHEAD)
    if sys.argv[1] == "sleep":
        time.sleep(60)
    raise SystemExit(int(sys.argv[1]))
"""


@pytest.fixture
def demo(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "warmdemo.py").write_text(DEMO, encoding="utf-8")
    (lib / "warmdep.py").write_text(DEP, encoding="utf-8")
    return {"PYTHONPATH": str(lib), "PATH": os.environ["PATH"]}


def waiting(paths, env, deadline=30.0, module="warmdemo"):
    """Starts the warm launcher of the run and waits until it listens."""
    root = os.path.dirname(os.path.dirname(paths["dir"]))
    said = start_warm(sys.executable, module, paths["dir"], root, {"GREETING": "hello"},
                      deadline, environ=env)
    assert said["started"], said
    # It listens once its socket is bound (before its import): the kernel's list of Unix
    # sockets shows the name, with "@" for the abstract namespace. No sleep that a busy machine
    # could outlast.
    bound = f"@{socket_name(paths['dir'])}"
    until = time.monotonic() + 30
    while time.monotonic() < until and not listening(bound):
        time.sleep(0.02)
    assert listening(bound), "the warm launcher never bound its socket"
    return said["pid"]


def listening(name):
    with open("/proc/net/unix", encoding="utf-8") as handle:
        return any(line.split()[-1] == name for line in handle.readlines()[1:]
                   if len(line.split()) >= 8)


def environ_of(pid):
    with open(f"/proc/{pid}/environ", "rb") as handle:
        return handle.read().split(b"\0")


def argv(code, *more):
    return [sys.executable, "-m", "warmdemo", str(code), *more]


def test_the_start_hands_the_warm_launcher_its_job_and_hears_its_exit_code(tmp_path, demo):
    paths = run_paths(str(tmp_path), "r1")
    os.makedirs(paths["dir"])
    before = time.time()
    pid = waiting(paths, demo)
    # The run's marker is in its environment (stop finds it), the secret never is.
    assert f"{MARKER}={paths['dir']}".encode() in environ_of(pid)
    env = dict(demo, GREETING="hi", TOKEN="s3cr3t")
    started = argv(7)
    proc, seen = claim(paths["dir"], started, env, str(tmp_path), paths["log"])
    assert seen["used"] and seen["pid"] == pid == proc.pid
    # When it started and finished its import, and when the start asked it for the job (which
    # may come before the import is done: the start waits then).
    assert before <= seen["started_at"] <= seen["ready_at"] <= time.time()
    assert before <= seen["asked_at"] <= time.time()
    assert proc.wait(20) == 7 and proc.poll() == 7
    said = log_text(paths).split()
    assert said[said.index("cwd") + 1] == str(tmp_path)
    assert said[said.index("greeting") + 1] == "hi" and said[said.index("token") + 1] == "s3cr3t"
    # What its module imports was there before the start came: that is the time it saves.
    assert said[said.index("imported_before") + 1] == "True"
    # What the import printed reaches the log, first, as from a launcher started anew.
    assert said[:2] == ["warmdep", "imported"] and said.count("imported") == 1, said


def test_without_a_warm_launcher_the_claim_says_so_and_nothing_waits(tmp_path, demo):
    paths = run_paths(str(tmp_path), "r1")
    proc, seen = claim(paths["dir"], argv(0), demo, str(tmp_path), str(tmp_path / "log"))
    assert proc is None and not seen["used"] and "none waits for this run" in seen["why"]


def test_another_interpreter_or_module_is_not_handed_over_and_it_waits_on(tmp_path, demo):
    paths = run_paths(str(tmp_path), "r1")
    os.makedirs(paths["dir"])
    waiting(paths, demo)
    other = ["/usr/bin/python3", "-m", "warmdemo", "0", "0"]
    proc, seen = claim(paths["dir"], other, demo, str(tmp_path), paths["log"])
    assert proc is None and "the launcher /usr/bin/python3 -m warmdemo" in seen["why"]
    proc, seen = claim(paths["dir"], argv(0), demo, str(tmp_path), paths["log"])
    assert seen["used"] and proc.wait(20) == 0


def test_an_unbuffered_launcher_is_handed_over_and_other_flags_are_not(tmp_path, demo):
    """DeepSpeed's launcher runs with -u: the warm launcher runs unbuffered anyway and takes it,
    its arguments after the module as they are. Any other flag is the launcher's to run anew."""
    paths = run_paths(str(tmp_path), "r1")
    os.makedirs(paths["dir"])
    waiting(paths, demo)
    flagged = [sys.executable, "-X", "dev", "-m", "warmdemo", "0"]
    proc, seen = claim(paths["dir"], flagged, demo, str(tmp_path), paths["log"])
    assert proc is None and f"the launcher {sys.executable} -X dev" in seen["why"], seen
    unbuffered = [sys.executable, "-u", "-m", "warmdemo", "3", "--more"]
    proc, seen = claim(paths["dir"], unbuffered, demo, str(tmp_path), paths["log"])
    assert seen["used"] and proc.wait(20) == 3
    said = log_text(paths).split()
    assert said[said.index("argv") + 1:said.index("cwd")] == ["['3',", "'--more']"]


def test_an_unclaimed_warm_launcher_ends_at_its_deadline(tmp_path, demo):
    paths = run_paths(str(tmp_path), "r1")
    pid = waiting(paths, demo, deadline=1.0)
    until = time.monotonic() + 10
    while time.monotonic() < until and pid in job_pids(paths["dir"]):
        time.sleep(0.05)
    assert pid not in job_pids(paths["dir"])
    assert claim(paths["dir"], argv(0), demo, str(tmp_path), paths["log"])[0] is None


def test_a_module_that_fails_to_import_is_started_anew(tmp_path, demo):
    paths = run_paths(str(tmp_path), "r1")
    waiting(paths, demo, module="no_such_module_here")
    bad = [sys.executable, "-m", "no_such_module_here"]
    proc, seen = claim(paths["dir"], bad, demo, str(tmp_path), paths["log"])
    assert proc is None and "its import failed: ModuleNotFoundError" in seen["why"]


def test_a_warm_launcher_killed_by_a_signal_ends_with_that_signal(tmp_path, demo):
    paths = run_paths(str(tmp_path), "r1")
    os.makedirs(paths["dir"])
    waiting(paths, demo)
    proc, _seen = claim(paths["dir"], argv("sleep"), dict(demo, TOKEN="s3cr3t"), str(tmp_path),
                        paths["log"])
    until = time.monotonic() + 10
    while time.monotonic() < until and "argv" not in log_text(paths):
        time.sleep(0.05)
    # The job has the secret (it said so); the process's initial environment, which others on
    # the node may read in /proc, never had it.
    assert "token s3cr3t" in log_text(paths)
    assert not any(item.startswith(b"TOKEN=") for item in environ_of(proc.pid))
    os.kill(proc.pid, signal.SIGTERM)
    assert proc.wait(10) == -signal.SIGTERM


def test_the_supervisor_runs_the_job_in_the_warm_launcher_and_records_it(tmp_path, demo):
    paths = run_paths(str(tmp_path), "r1")
    pid = waiting(paths, demo)
    p = params(warm=True, env={"GREETING": "hi"}, secret_env={"TOKEN": "s3cr3t"},
               chdir=str(tmp_path), launcher="deepspeed")
    spawn(p, paths, argv(3), demo)
    state = ended(paths)
    assert (state["state"], state["exit_code"], state["pid"]) == ("failed", 3, pid)
    record = read_record(paths)["job"]
    assert record["warm"]["used"] and record["warm"]["pid"] == pid
    assert "greeting hi token s3cr3t" in log_text(paths)
    assert not job_pids(paths["dir"])


def test_the_supervisor_starts_the_launcher_anew_where_none_waits(tmp_path, demo):
    paths = run_paths(str(tmp_path), "r1")
    spawn(params(warm=True, chdir=str(tmp_path), launcher="deepspeed"), paths, argv(0), demo)
    state = ended(paths)
    assert (state["state"], state["exit_code"]) == ("succeeded", 0)
    assert not read_record(paths)["job"]["warm"]["used"]
    assert "imported_before False" in log_text(paths)


def test_stop_ends_a_job_in_the_warm_launcher_and_an_unclaimed_one(tmp_path, demo):
    from ansible_collections.torchherd.cluster.plugins.module_utils._stop import stop

    paths = run_paths(str(tmp_path), "r1")
    waiting(paths, demo)
    spawn(params(warm=True, chdir=str(tmp_path), launcher="deepspeed"), paths, argv("sleep"), demo)
    until = time.monotonic() + 10
    while time.monotonic() < until and "argv" not in log_text(paths):
        time.sleep(0.05)
    stop(paths, read_state(paths)["pid"], 2)
    assert ended(paths)["state"] == "stopped" and not job_pids(paths["dir"])
    # One that no start claimed (the launch failed before) goes with the run's stop too.
    other = run_paths(str(tmp_path), "r2")
    os.makedirs(other["dir"])
    waiting(other, demo)
    stop(other, None, 1)
    assert not job_pids(other["dir"])


def test_a_run_that_does_not_start_here_sends_its_warm_launcher_away(tmp_path, demo):
    paths = run_paths(str(tmp_path), "r1")
    pid = waiting(paths, demo)
    assert dismiss(paths["dir"]) == [pid]
    until = time.monotonic() + 10
    while time.monotonic() < until and pid in job_pids(paths["dir"]):
        time.sleep(0.05)
    assert not job_pids(paths["dir"]) and dismiss(paths["dir"]) == []


def test_a_launcher_in_a_package_runs_without_runpys_warning(tmp_path, demo):
    """torchrun is torch.distributed.run: runpy warns that a package's module it runs as
    __main__ was imported before. The import ahead is on purpose, and the log says nothing of
    it, as the log of a launcher started anew would not."""
    package = tmp_path / "lib" / "warmpkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "launch.py").write_text(DEMO, encoding="utf-8")
    paths = run_paths(str(tmp_path), "r-pkg")
    os.makedirs(paths["dir"])
    waiting(paths, demo, module="warmpkg.launch")
    proc, seen = claim(paths["dir"], [sys.executable, "-m", "warmpkg.launch", "0"], demo,
                       str(tmp_path), paths["log"])
    assert seen["used"] and proc.wait(20) == 0
    said = log_text(paths)
    assert "imported_before True" in said, said
    assert "RuntimeWarning" not in said and "found in sys.modules" not in said, said


def test_no_runpy_warning_in_the_log_and_the_jobs_own_warnings_stay(tmp_path, demo):
    """torchrun is torch.distributed.run, a module of a package: run as __main__ after it was
    imported ahead, runpy warns that it was found in sys.modules. A launcher started anew
    prints no such line, and the warm one must not either; a RuntimeWarning of the job's own
    still reaches the log."""
    package = tmp_path / "lib" / "warmpkg"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "run.py").write_text(
        "import warnings\nif __name__ == '__main__':\n"
        "    warnings.warn('the job says so', RuntimeWarning)\n", encoding="utf-8")
    paths = run_paths(str(tmp_path), "r1")
    os.makedirs(paths["dir"])
    waiting(paths, demo, module="warmpkg.run")
    proc, seen = claim(paths["dir"], [sys.executable, "-m", "warmpkg.run"], demo,
                       str(tmp_path), paths["log"])
    assert seen["used"] and proc.wait(20) == 0
    text = log_text(paths)
    assert "found in sys.modules" not in text, text
    assert "RuntimeWarning: the job says so" in text, text
