"""More nodes than Ansible forks. The start's barrier runs in the supervisors (the later nodes
start while the first wait there) and the nodes stop each other after a failure, so no node
waits for a controller worker to be stopped.

The suite runs 6 nodes with 2 forks (three batches: the mechanism whole, in a minute);
TORCHHERD_SCALE=32:8 runs 32 nodes with 8 forks (about 4 minutes and 8 GiB here)."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from driver import launch
from driver.api import Exit
from tests.integration.helpers import EXAMPLES, assert_no_job_left

pytestmark = pytest.mark.cluster

NODES, FORKS = (int(n) for n in os.environ.get("TORCHHERD_SCALE", "6:2").split(":"))
FAIL = NODES - 2  # a rank of a node in the last batch
OK_LINE = re.compile(r"torchherd-allreduce ok host=\S+ node_rank=(\d+) local_rank=\d+ rank=(\d+) "
                     r"sum=(\S+) expected=(\S+)")


def job(run_id, *args):
    # A window for the barrier that covers the batches of forks (each start returns at once).
    return {"script": "allreduce.py", "args": list(args), "code_src": str(EXAMPLES),
            "nproc_per_node": 1, "run_id": run_id, "probe_window": 60}


def test_more_nodes_than_forks_run_and_stop_together_after_a_failure(make_cluster, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("ANSIBLE_FORKS", str(FORKS))
    cluster = make_cluster(f"forks{NODES}", NODES)
    result = launch(job("forks-ok"), cluster.inventory, runs_dir=tmp_path)
    assert result.ok, result.reason
    found = []
    for node in cluster.nodes:
        log = (tmp_path / "forks-ok" / "nodes" / node.name / "node.log").read_text()
        found += OK_LINE.findall(log)
    assert sorted(int(f[1]) for f in found) == list(range(NODES))
    assert {(f[2], f[3]) for f in found} == {(str(NODES * (NODES - 1) // 2),) * 2}
    # Every node met at the barrier in its supervisor, not in the start task (its record).
    barrier = json.loads((tmp_path / "forks-ok" / "nodes" / cluster.nodes[0].name
                          / "run.json").read_text())["barrier"]
    assert barrier["go"] and barrier["served"] == NODES and barrier["where"] == "supervisors"

    # A rank raises a second after the all-reduce; its node tells the master's supervisor,
    # which stops every node: all within 10 s, whatever the controller's workers are doing.
    assert_failure_stops_every_node(cluster, cluster.inventory, tmp_path, "forks-fail")


def test_barrier_off_with_fewer_forks_still_stops_every_node_after_a_failure(make_cluster,
                                                                             tmp_path,
                                                                             monkeypatch):
    # The barrier turned off on every node: with fewer forks than nodes the controller watches
    # the master alone, so the nodes' gang must still form (the schedule keeps the supervisors'
    # meeting) or a failing rank on a later node goes unnoticed until the master ends.
    monkeypatch.setenv("ANSIBLE_FORKS", str(FORKS))
    cluster = make_cluster(f"nobar{NODES}", NODES)
    inventory = cluster.write_inventory(
        {node.name: {"torchherd_torchrun_barrier": "false"} for node in cluster.nodes})
    assert_failure_stops_every_node(cluster, inventory, tmp_path, "nobar-fail")
    schedule = json.loads((tmp_path / "nobar-fail" / "schedule.json").read_text())
    assert schedule["barrier"] == "supervisors" and schedule["gang"], schedule
    assert "turned off" in schedule["why"]["barrier"]


def assert_failure_stops_every_node(cluster, inventory, runs_dir, run_id):
    failed = launch(job(run_id, "--fail-rank", str(FAIL), "--fail-after", "1"),
                    inventory, runs_dir=runs_dir)
    returned = time.time()
    assert failed.exit_code == Exit.JOB_FAILED, failed.reason
    summary = json.loads((runs_dir / run_id / "summary.json").read_text())
    culprit = cluster.nodes[FAIL].name
    assert culprit in summary["reason"], summary["reason"]
    assert f"injected failure on rank {FAIL}" in summary["reason"]
    log = (runs_dir / run_id / "nodes" / culprit / "node.log").read_text()
    failed_at = float(re.search(rf"torchherd-fail rank={FAIL} t=([\d.]+)", log).group(1))
    slowest = max(h["ended_at"] - failed_at for h in summary["hosts"].values())
    assert slowest < 10, f"the last node stopped {slowest:.1f} s after the failure"
    assert {h["state"] for n, h in summary["hosts"].items() if n != culprit} <= {"stopped",
                                                                                "failed"}
    print(f"{run_id}: {NODES} nodes, forks {FORKS}: failure -> all stopped {slowest:.1f} s, "
          f"-> launch returned {returned - failed_at:.1f} s")
    assert_no_job_left(cluster, r"torch\.distributed\.run|allreduce\.py")
