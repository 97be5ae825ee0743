"""Stacks: the job's processes told apart by their environment (real processes), py-spy's
absence named, and the report over recorded py-spy answers naming the odd rank out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ansible_collections.torchherd.cluster.plugins.filter.stacks import stacks_report
from ansible_collections.torchherd.cluster.plugins.module_utils import _stacks
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import MARKER

# A rank that starts a child of its own (a data loader worker inherits the rank's environment).
RANK_WITH_CHILD = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
time.sleep(60)
"""


@pytest.fixture
def job(tmp_path):
    run_dir = str(tmp_path / "runs" / "r1")
    base = dict(os.environ, **{MARKER: run_dir})
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=base)
    rank = subprocess.Popen([sys.executable, "-c", RANK_WITH_CHILD],
                            env=dict(base, RANK="3", LOCAL_RANK="1"))
    deadline = time.monotonic() + 10
    while len(_stacks.processes(run_dir)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield run_dir, launcher.pid, rank.pid
    for proc in (launcher, rank):
        proc.kill()
        proc.wait()
    for found in _stacks.processes(run_dir):
        os.kill(found["pid"], 9)


def test_the_jobs_processes_are_told_apart_by_their_environment(job):
    run_dir, launcher, rank = job
    found = {p["pid"]: p for p in _stacks.processes(run_dir)}
    assert found[launcher]["role"] == "launcher" and found[launcher]["rank"] is None
    assert (found[rank]["role"], found[rank]["rank"], found[rank]["local_rank"]) == ("rank", 3, 1)
    child = [p for pid, p in found.items() if pid not in (launcher, rank)]
    assert [(p["role"], p["rank"]) for p in child] == [("child", 3)]


def test_without_py_spy_the_error_says_how_to_get_it(job, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(_stacks.StacksError, match="pip install py-spy"):
        _stacks.collect(job[0], "/nonexistent/python3")


def frames(*names):
    return [{"name": n, "file": f, "line": line} for n, f, line in names]


WAITING = frames(("all_reduce", "/venv/lib/python3.11/site-packages/torch/distributed/"
                  "distributed_c10d.py", 3252),
                 ("step", "/code/train.py", 25), ("main", "/code/train.py", 45))
STUCK = frames(("stall", "/code/train.py", 21), ("main", "/code/train.py", 43))


def node(*ranks):
    return {"processes": [
        {"pid": 100 + rank, "rank": rank, "local_rank": rank % 2, "role": "rank", "error": None,
         "threads": [{"thread_id": 7, "name": "pin", "main": False, "frames": STUCK},
                     {"thread_id": 100 + rank, "name": "MainThread", "main": True,
                      "frames": stack}]}
        for rank, stack in ranks] + [{"pid": 99, "rank": None, "role": "launcher",
                                      "threads": [], "error": None}]}


PLAN = {"nodes": [{"host": "a", "node_rank": 0}, {"host": "b", "node_rank": 1}]}


def test_the_rank_outside_the_collective_is_named_with_where_it_is():
    out = stacks_report({"a": node((0, WAITING), (1, WAITING)),
                         "b": node((2, WAITING), (3, STUCK))}, PLAN, reason="hang")
    report = out["report"]
    assert [(o["rank"], o["host"], o["where"]) for o in report["odd"]] == \
        [(3, "b", "stall (train.py:21)")]
    assert report["groups"][0] == {"where": "all_reduce (distributed_c10d.py:3252)",
                                   "ranks": [0, 1, 2]}
    assert out["summary"] == ("rank 3 on b in stall (train.py:21); the other 3 ranks in "
                              "all_reduce (distributed_c10d.py:3252) from step (train.py:25)")
    json_name, text_name = sorted(out["files"])
    assert json_name.endswith(".json") and text_name.endswith(".txt")
    text = out["files"][text_name]
    assert text.count("-- rank ") == 4 and "stall (train.py:21)  /code/train.py" in text


def test_all_ranks_in_one_place_have_no_odd_one_and_errors_are_kept():
    out = stacks_report({"a": node((0, WAITING), (1, WAITING)),
                         "b": {"processes": [], "error": "py-spy not found"}}, PLAN)
    assert out["report"]["odd"] == [] and out["report"]["errors"] == {"b": "py-spy not found"}
    assert out["summary"].startswith("all 2 ranks in all_reduce")
