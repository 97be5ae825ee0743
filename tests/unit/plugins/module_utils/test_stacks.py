"""Stacks: the job's processes told apart by their environment (real processes), py-spy's
absence named, the report over recorded py-spy answers naming the odd rank out, and NCCL's RAS
asked over its protocol (a local server answering with reports recorded from NCCL 2.28.9)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

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
    with pytest.raises(_stacks.StacksError, match="expected py-spy next to") as raised:
        _stacks.collect(job[0], "/nonexistent/python3")
    assert raised.value.fix.startswith("/nonexistent/python3 -m pip install py-spy")


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


RAS = Path(__file__).resolve().parent / "fixtures" / "nccl_ras"


class FakeRas:
    """A TCP server on a free local port that answers as NCCL's RAS client socket does (the
    protocol of ncclras: CLIENT PROTOCOL -> SERVER PROTOCOL, TIMEOUT -> OK, STATUS -> the report
    until the connection closes), or with `hello` in place of its greeting."""

    def __init__(self, report, hello="SERVER PROTOCOL 2\n"):
        self.report, self.hello, self.heard = report, hello, []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _addr = self.sock.accept()
        with conn, conn.makefile("r") as lines:
            for line in lines:
                self.heard.append(line.strip())
                if line.startswith("CLIENT PROTOCOL"):
                    conn.sendall(self.hello.encode())
                elif line.startswith("TIMEOUT"):
                    conn.sendall(b"OK\n")
                elif line.strip() == "STATUS":
                    conn.sendall(self.report.encode())
                    break
        self.sock.close()


def test_nccls_ras_is_asked_as_its_client_asks_and_its_findings_read():
    report = (RAS / "status_mismatch.txt").read_text()
    server = FakeRas(report)
    found = _stacks.ask_nccl_ras(server.address, timeout=5)
    server.thread.join(5)
    assert server.heard == ["CLIENT PROTOCOL 2", "TIMEOUT 5", "STATUS"]
    assert found == {"address": server.address, "text": report, "error": None}
    assert _stacks.ras_findings(found["text"]) == {"Warnings": [
        "#0-0 (878ccc0ae6a15df3) MISMATCH",
        "  Communicator ranks have different AllReduce operation counts",
        "  Rank 0 has launched up to operation 4 -- GPU 0 managed by process 718 on node "
        "192.0.2.2",
        "  Rank 1 has launched up to operation 3 -- GPU 0 managed by process 719 on node "
        "192.0.2.2"]}
    assert _stacks.ras_findings((RAS / "status_ok.txt").read_text()) == {}


def test_no_ras_or_something_else_on_its_port_is_said_not_raised():
    server = FakeRas("", hello="HTTP/1.0 400 Bad Request\n")
    found = _stacks.ask_nccl_ras(server.address)
    assert found["text"] is None and "not NCCL's RAS" in found["error"]
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    found = _stacks.ask_nccl_ras(f"127.0.0.1:{port}")
    assert found["text"] is None and found["error"]


def test_where_ras_answers_follows_the_ranks_environment():
    nccl = {"RANK": "0", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/r/flight_recorder/pipe_"}
    assert _stacks.ras_address(nccl) == "localhost:28028"
    assert _stacks.ras_address(dict(nccl, NCCL_RAS_ADDR="127.0.0.1:29000")) == "127.0.0.1:29000"
    assert _stacks.ras_address(dict(nccl, NCCL_RAS_ENABLE="0")) is None
    assert _stacks.ras_address({"RANK": "0"}) is None  # gloo: no NCCL
    assert _stacks.ras_address({"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": "/p"}) is None  # launcher


def test_the_report_carries_what_ras_found_wrong():
    findings = _stacks.ras_findings((RAS / "status_mismatch.txt").read_text())
    a = dict(node((0, WAITING)), nccl_ras={"address": "localhost:28028", "error": None,
                                            "text": "report of a", "findings": findings})
    b = dict(node((1, STUCK)), nccl_ras={"address": "localhost:28028", "text": None,
                                          "error": "[Errno 111] Connection refused",
                                          "findings": {}})
    out = stacks_report({"a": a, "b": b}, PLAN, reason="hang")
    assert out["summary"].startswith("ranks in ")
    assert " | NCCL RAS (a): #0-0 (878ccc0ae6a15df3) MISMATCH; Communicator ranks have " \
        "different AllReduce operation counts; Rank 0 has launched up to operation 4" \
        in out["summary"]
    assert out["summary"].endswith("Rank 1 has launched up to operation 3 -- GPU 0 managed by "
                                   "process 719 on node 192.0.2.2")
    assert out["report"]["nccl_ras"]["b"]["error"] == "[Errno 111] Connection refused"
    assert "text" not in out["report"]["nccl_ras"]["a"]
    ras_file = next(name for name in out["files"] if name.endswith(".nccl-ras.txt"))
    assert out["files"][ras_file] == \
        "== NCCL RAS status from a (localhost:28028)\nreport of a\n"
    text = next(v for k, v in out["files"].items() if k.endswith(".txt") and k != ras_file)
    assert "  b: NCCL RAS at localhost:28028: no answer ([Errno 111] Connection refused)" in text
    assert "    Warnings:\n      #0-0 (878ccc0ae6a15df3) MISMATCH" in text
    # Nothing wrong: the summary is the stacks' alone.
    quiet = dict(a, nccl_ras=dict(a["nccl_ras"], findings={}))
    assert " | " not in stacks_report({"a": quiet}, PLAN)["summary"]


def without_py_spy(*ranks):
    """What job_stacks answers on a node without py-spy: its ranks, no stack, the error and the
    fix apart (StacksError)."""
    try:
        _stacks.find_py_spy("/venv/bin/python")
    except _stacks.StacksError as exc:
        error, fix = str(exc), exc.fix
    return {"processes": [{"pid": 100 + rank, "rank": rank, "local_rank": rank % 4,
                           "role": "rank"} for rank in ranks], "error": error, "fix": fix}


def test_nodes_without_py_spy_say_the_fix_once_and_keep_every_rank(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    plan = {"nodes": [{"host": "a", "node_rank": 0}, {"host": "b", "node_rank": 1}]}
    out = stacks_report({"a": without_py_spy(0, 1, 2, 3), "b": without_py_spy(4, 5, 6, 7)}, plan)
    report = out["report"]
    error = "py-spy: expected py-spy next to /venv/bin/python or on PATH, found neither"
    fix = ("/venv/bin/python -m pip install py-spy into the job's environment on every node (a "
           "static binary, no build)")
    assert report["errors"] == {"a": error, "b": error}
    assert report["problems"] == [{"hosts": ["a", "b"], "ranks": [], "error": error, "fix": fix}]
    assert [(r["host"], r["rank"]) for r in report["ranks"]] == [
        ("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 4), ("b", 5), ("b", 6), ("b", 7)]
    assert out["summary"] == f"no stack of the 8 ranks could be read (a, b: {error})"
    text = out["files"][next(name for name in out["files"] if name.endswith(".txt"))]
    assert text.count(fix) == 1 and f"  a, b: {error}\n    fix: {fix}\n" in text
    assert text.count("-- rank ") == 8


def test_ranks_whose_memory_py_spy_may_not_read_say_the_fix_once_per_problem():
    results = node((0, WAITING), (1, WAITING))
    for proc in results["processes"][:2]:
        proc.update(threads=None, error="Error: Permission denied (os error 13)",
                    fix=_stacks.PTRACE_FIX)
    out = stacks_report({"a": results}, PLAN)
    assert out["report"]["problems"] == [{"hosts": ["a"], "ranks": [0, 1],
                                          "error": "Error: Permission denied (os error 13)",
                                          "fix": _stacks.PTRACE_FIX}]
    assert out["summary"] == ("no stack of the 2 ranks could be read (a ranks 0, 1: Error: "
                              "Permission denied (os error 13))")
    text = out["files"][next(name for name in out["files"] if name.endswith(".txt"))]
    assert text.count(_stacks.PTRACE_FIX) == 1
    assert "pid 100: Error: Permission denied (os error 13)\n" in text
