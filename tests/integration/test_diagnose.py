"""A slow link or a hung rank is found and named, not waited out: the interconnect check with a
throttled data link (tc on a node's interface), the hang watch on a job with one rank stuck
outside the collective, and stacks of a healthy job left running. Real SSH, gloo, tc, py-spy."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from driver import launch, stacks, status, stop, verify
from driver.api import Exit
from tests.integration.helpers import EXAMPLES, assert_no_job_left, per_node, wait_for

pytestmark = pytest.mark.cluster

JOB_PROCS = r"torch\.distributed\.run|stall\.py|allreduce\.py"


def job(run_id, script="allreduce.py", *args, **extra):
    return {"script": script, "args": list(args), "code_src": str(EXAMPLES),
            "nproc_per_node": 1, "run_id": run_id, **extra}


def preflight(runs, run_id):
    return json.loads((runs / run_id / "preflight.json").read_text())["gate"]


def test_the_interconnect_check_names_a_throttled_node(uneven, tmp_path):
    fresh = {"interconnect_max_age": 0}
    result = verify(job("ic-ok", **fresh), uneven.inventory, runs_dir=tmp_path)
    assert result.ok, result.reason
    measured = preflight(tmp_path, "ic-ok")["interconnect"]
    assert measured["ok"] and measured["allreduce"]["world_size"] == 3
    assert measured["allreduce"]["busbw"] > measured["threshold_gbps"] > 0
    assert measured["allreduce"]["latency_us"] > 0 and len(measured["pairs"]) == 3
    assert result.interconnect["allreduce"]["busbw"] == measured["allreduce"]["busbw"]

    # The same nodes again: the measure is reused, and says whose it was.
    again = verify(job("ic-again"), uneven.inventory, runs_dir=tmp_path)
    assert again.ok, again.reason
    assert preflight(tmp_path, "ic-again")["interconnect"]["reused"]["run_id"] == "ic-ok"

    slow = uneven.nodes[1]
    uneven.throttle(slow, "20mbit")
    try:
        failed = verify(job("ic-slow", **fresh), uneven.inventory, runs_dir=tmp_path)
    finally:
        uneven.unthrottle(slow)
    assert failed.exit_code == Exit.PREFLIGHT_FAILED, failed.reason
    problems = [p for p in failed.problems if p["check"] == "interconnect"]
    assert [p["host"] for p in problems] == [slow.name], failed.problems
    assert "slow with every peer" in problems[0]["found"]
    verdict = preflight(tmp_path, "ic-slow")["interconnect"]
    assert verdict["slow_nodes"] == [slow.name]
    assert verdict["allreduce"]["busbw"] < verdict["threshold_gbps"]
    pairs = {(p["a"], p["b"]): p["gbps"] for p in verdict["pairs"]}
    fast = pairs[(uneven.nodes[0].name, uneven.nodes[2].name)]
    assert all(g < fast / 4 for pair, g in pairs.items() if slow.name in pair), pairs

    # Unthrottled it passes again; before a launch (interconnect always) too, in summary.json.
    launched = launch(job("ic-launch", interconnect="always", **fresh), uneven.inventory,
                      runs_dir=tmp_path)
    assert launched.ok, launched.reason
    summary = json.loads((tmp_path / "ic-launch" / "summary.json").read_text())
    assert summary["interconnect"]["ok"] and summary["interconnect"]["reused"] is None
    assert_no_job_left(uneven, JOB_PROCS)


def test_a_rank_stuck_outside_the_collective_is_found_named_and_stopped(uneven, tmp_path):
    # Rank 3 (node1's second) sleeps in stall() while the other five wait in an all-reduce.
    # Longer than the start's own silence (every rank importing torch on a loaded machine).
    hang_timeout = 30
    result = launch(job("hung", "stall.py", "--stall-rank", "3", nproc_per_node=2,
                        hang_timeout=hang_timeout, on_hang="stop"),
                    uneven.inventory, runs_dir=tmp_path)
    assert result.exit_code == Exit.HUNG and result.state == "hung", result.reason
    hang = result.hang
    # Declared within the set time plus a few seconds of the last output of any rank.
    assert hang_timeout <= hang["quiet_for"] <= hang_timeout + 6, hang
    assert [(o["rank"], o["host"]) for o in hang["odd"]] == [(3, uneven.nodes[1].name)]
    assert hang["odd"][0]["where"].startswith("stall (stall.py:")
    assert "rank 3" in result.reason and "stall" in result.reason and hang["stopped"]
    report = json.loads(Path(hang["stacks"]).with_suffix(".json").read_text())
    assert sorted(r["rank"] for r in report["ranks"]) == list(range(6))
    assert all(r["threads"] for r in report["ranks"])
    others = [g for g in report["groups"] if g["ranks"] == [0, 1, 2, 4, 5]]
    assert others and others[0]["where"].startswith("all_reduce ("), report["groups"]
    # Stopped; a rank may fail first as its peers' stop closes their connections.
    assert {h["state"] for h in result.hosts.values()} <= {"stopped", "failed"}
    assert_no_job_left(uneven, JOB_PROCS)


def test_stacks_of_a_healthy_detached_job_leave_it_running(uneven, tmp_path):
    started = launch(job("healthy", "stall.py", "--stall-rank", "-1", "--steps", "100000",
                         "--interval", "0.2", nproc_per_node=2, detach=True),
                     uneven.inventory, runs_dir=tmp_path)
    assert started.ok, started.reason
    try:
        # Until every rank is in the job's own loop (not still importing torch): first as each
        # node's log tells it (a look that costs no playbook run), then as the stacks show it.
        def in_loop(node) -> bool:
            log = uneven.exec(node, ["cat", "/root/.torchherd/runs/healthy/node.log"],
                              check=False).stdout
            return len(set(re.findall(r"torchherd-stall rank=(\d+) step=[1-9]", log))) == 2

        wait_for(lambda: all(per_node(in_loop, uneven.nodes)), 90, "every rank's steps",
                 interval=1)
        deadline = time.monotonic() + 90
        while True:
            result = stacks("healthy", runs_dir=tmp_path)
            assert result.ok, result.reason
            ranks = result.stacks["ranks"]
            if len(ranks) == 6 and all(r["own"] and "stall.py" in r["own"] for r in ranks):
                break
            assert time.monotonic() < deadline, result.stacks["summary"]
            time.sleep(2)
        assert sorted(r["rank"] for r in ranks) == list(range(6))
        assert {r["host"] for r in ranks} == {n.name for n in uneven.nodes}
        assert Path(result.stacks["text"]).read_text().count("-- rank ") == 6
        assert status("healthy", runs_dir=tmp_path).state == "running"
    finally:
        stopped = stop("healthy", runs_dir=tmp_path)
    assert stopped.state == "stopped", stopped.reason
    assert_no_job_left(uneven, JOB_PROCS)
