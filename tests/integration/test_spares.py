"""Spare nodes on a real cluster: four container nodes, a three-node job, one node marked
torchherd_spare. A node that fails preflight (torch broken on it, or its sshd down) is left out,
and the spare takes its node rank; the job runs on the healthy three over real SSH and gloo."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from driver import launch
from tests.integration.helpers import EXAMPLES, assert_no_job_left

pytestmark = pytest.mark.cluster

OK_LINE = re.compile(r"torchherd-allreduce ok host=\S+ node_rank=(\d+) local_rank=\d+ "
                     r"rank=(\d+) sum=(\S+) expected=(\S+)")


def ranks_by_node(runs: Path, run_id: str, names: list[str]) -> dict[str, set[int]]:
    """{node: the node ranks its ranks printed}, from the logs that came back."""
    found = {}
    for name in names:
        log = runs / run_id / "nodes" / name / "node.log"
        if log.exists():
            lines = OK_LINE.findall(log.read_text())
            assert all(s == e for _, _, s, e in lines), lines
            found[name] = {int(node_rank) for node_rank, *_ in lines}
    return found


@pytest.fixture
def spares(make_cluster):
    cluster = make_cluster("spares", 4)
    inventory = cluster.write_inventory({"node3": {"torchherd_spare": "true"}})
    return cluster, inventory


def test_a_spare_takes_the_place_of_a_node_that_fails_preflight(spares, tmp_path):
    cluster, inventory = spares
    names = [n.name for n in cluster.nodes]
    job = {"script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 2}

    # torch broken on node1: its package directory moved away.
    where = cluster.exec(cluster.nodes[1], ["/usr/bin/python3", "-c",
                                            "import os, torch; print(os.path.dirname("
                                            "torch.__file__))"]).stdout.strip()
    cluster.exec(cluster.nodes[1], ["mv", where, where + ".broken"])
    try:
        result = launch({**job, "run_id": "torch-broken"}, inventory, runs_dir=tmp_path)
    finally:
        cluster.exec(cluster.nodes[1], ["mv", where + ".broken", where])
    assert result.ok, result.reason
    assert list(result.left_out) == [names[1]] and "torch" in result.left_out[names[1]]
    # The spare has node1's rank; the others keep theirs; every sum is right (6 ranks).
    assert ranks_by_node(tmp_path, "torch-broken", names) == {
        names[0]: {0}, names[3]: {1}, names[2]: {2}}
    assert result.world_size == 6
    summary = json.loads((tmp_path / "torch-broken" / "summary.json").read_text())
    assert sorted(summary["hosts"]) == sorted([names[0], names[2], names[3]])
    assert summary["left_out"] == result.left_out
    preflight = json.loads((tmp_path / "torch-broken" / "preflight.json").read_text())
    assert names[1] in preflight["gate"]["table"] and preflight["left_out"] == result.left_out
    plan = json.loads((tmp_path / "torch-broken" / "plan.json").read_text())
    assert [n["host"] for n in plan["nodes"]] == [names[0], names[3], names[2]]
    # Nothing ran or was left on the node left out.
    assert cluster.exec(cluster.nodes[1], ["test", "-e", "/root/.torchherd/runs/torch-broken"],
                        check=False).returncode != 0
    assert_no_job_left(cluster)

    # The master's sshd down: the spare takes rank 0 and with it the master's place.
    cluster.stop_sshd(cluster.nodes[0])
    # A stopped sshd leaves existing sessions (Ansible's ControlPersist masters) alive.
    cluster.exec(cluster.nodes[0], ["pkill", "-x", "sshd"], check=False)
    try:
        result = launch({**job, "run_id": "master-down"}, inventory, runs_dir=tmp_path)
    finally:
        cluster.start_sshd(cluster.nodes[0])
        cluster.wait_ssh()
    assert result.ok, result.reason
    assert list(result.left_out) == [names[0]]
    assert result.master and result.master["host"] == names[3]
    assert ranks_by_node(tmp_path, "master-down", names) == {
        names[3]: {0}, names[1]: {1}, names[2]: {2}}
    assert_no_job_left(cluster)


def test_without_enough_healthy_nodes_preflight_fails_as_before(spares, tmp_path):
    cluster, inventory = spares
    names = [n.name for n in cluster.nodes]
    # Two nodes whose Python has no torch at all, and one spare: two healthy nodes of three.
    broken = cluster.write_inventory({"node3": {"torchherd_spare": "true"},
                                      "node1": {"torchherd_python": "/nonexistent/python3"},
                                      "node2": {"torchherd_python": "/nonexistent/python3"}})
    job = {"script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 1}
    result = launch({**job, "run_id": "too-few"}, broken, runs_dir=tmp_path)
    assert result.state == "preflight_failed", result.reason
    assert {p["host"] for p in result.problems} == {names[1], names[2]}
    # With two nodes enough (min_node_count), it runs on node0 and the spare.
    result = launch({**job, "run_id": "fewer", "min_node_count": 2}, broken, runs_dir=tmp_path)
    assert result.ok, result.reason
    assert set(result.left_out) == {names[1], names[2]}
    assert ranks_by_node(tmp_path, "fewer", names) == {names[0]: {0}, names[3]: {1}}
    assert result.nnodes == "2" and result.world_size == 2
