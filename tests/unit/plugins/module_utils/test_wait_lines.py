"""The wait that speaks for the job, for a live view: it returns once its `lines` seconds
passed and a node's last line changed, and its answer carries every node's (nodes). Real
processes stand for the launcher and the master's supervisor; the lines are written into the
record as the master's supervisor writes them."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.wait import wait
from ansible_collections.torchherd.cluster.plugins.module_utils._proc import proc_start_time
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import run_paths
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import note_job
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record


class Module:
    check_mode = False

    def warn(self, text):
        raise AssertionError(text)


def process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    for _ in range(100):  # its start time, once the kernel shows it
        if proc_start_time(proc.pid):
            break
        time.sleep(0.01)
    return proc, {"pid": proc.pid, "start": proc_start_time(proc.pid)}


@pytest.fixture
def master(tmp_path):
    """A master whose launcher and supervisor run, whose gang every node joined, and whose
    record has two nodes' lines."""
    paths = run_paths(str(tmp_path), "r1")
    launcher, launched = process()
    supervisor, supervising = process()
    note_job(paths, started_at=time.time(), supervisor=supervising, launcher=launched,
             pid=launcher.pid)
    record(paths, "gang", joined=1, expected=1)
    record(paths, "gang", lines=lines("step 1", "step 1"))
    yield paths, launcher
    for proc in (launcher, supervisor):
        proc.kill()
        proc.wait()


def lines(n0, n1):
    return {"n0": {"last_line": f"[default0]:{n0}", "at": time.time()},
            "n1": {"last_line": f"[default0]:{n1}", "at": time.time()}}


def later(seconds, act):
    timer = threading.Timer(seconds, act)
    timer.start()
    return timer


def params(**changes):
    return dict({"gang": True, "hang": None, "lines": 0.6, "firewall": None, "run_id": "r1"},
                **changes)


def test_the_wait_returns_with_every_nodes_new_line_once_its_seconds_passed(master):
    paths, _launcher = master
    later(0.1, lambda: record(paths, "gang", lines=lines("step 1", "step 2")))
    began = time.monotonic()
    said = wait(Module(), params(), paths, 10)
    took = time.monotonic() - began
    # Not before its seconds (the change came at once), and soon after them.
    assert 0.6 <= took < 1.5, took
    assert said["job_state"] == "running" and not said["gang_ended"]
    assert {h: n["last_line"] for h, n in said["nodes"].items()} == {
        "n0": "[default0]:step 1", "n1": "[default0]:step 2"}
    assert all(isinstance(n["at"], float) for n in said["nodes"].values())


def test_unchanged_lines_or_no_live_view_wait_for_the_round(master):
    paths, _launcher = master
    began = time.monotonic()
    said = wait(Module(), params(), paths, 1.2)
    assert time.monotonic() - began >= 1.2
    assert said["nodes"]["n1"]["last_line"] == "[default0]:step 1"
    later(0.1, lambda: record(paths, "gang", lines=lines("step 1", "step 3")))
    began = time.monotonic()
    said = wait(Module(), params(lines=0), paths, 1.2)
    assert time.monotonic() - began >= 1.2  # no live view: the round's end is the news
    assert said["nodes"]["n1"]["last_line"] == "[default0]:step 3"


def test_the_lines_still_come_while_the_master_waits_for_its_gangs_end(master):
    """The master's own job ended; its supervisor stays for the others, whose lines go on."""
    paths, launcher = master
    launcher.kill()
    launcher.wait()
    note_job(paths, exit_code=0, ended_at=time.time())
    later(0.1, lambda: record(paths, "gang", lines=lines("done", "step 9")))
    began = time.monotonic()
    said = wait(Module(), params(), paths, 10)
    assert time.monotonic() - began < 2.0
    assert (said["job_state"], said["gang_ended"]) == ("succeeded", False)
    assert said["nodes"]["n1"]["last_line"] == "[default0]:step 9"


def test_a_single_nodes_wait_returns_with_its_own_new_line(master):
    paths, _launcher = master
    with open(paths["log"], "w", encoding="utf-8") as log:
        log.write("[default0]:step 1\n")

    def more():
        with open(paths["log"], "a", encoding="utf-8") as log:
            log.write("[default0]:step 2\n")

    later(0.1, more)
    began = time.monotonic()
    said = wait(Module(), params(gang=False), paths, 10)
    assert 0.6 <= time.monotonic() - began < 1.5
    assert said["last_line"] == "[default0]:step 2" and "nodes" not in said
