"""The interconnect check: its schedule, its verdict, and a real measure with gloo here."""

from __future__ import annotations

import inspect
import itertools
import json
import socket
import subprocess
import sys

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils import _interconnect
from ansible_collections.torchherd.cluster.plugins.module_utils._interconnect import (
    bus_factor,
    judge,
    rounds,
)


@pytest.mark.parametrize("count", [2, 3, 4, 5, 8, 9])
def test_every_pair_meets_once_and_no_node_twice_in_a_round(count):
    schedule = rounds(count)
    met = [pair for pairs in schedule for pair in pairs]
    assert sorted(met) == list(itertools.combinations(range(count), 2))
    for pairs in schedule:
        nodes = [n for pair in pairs for n in pair]
        assert len(nodes) == len(set(nodes))
    assert len(schedule) == (count if count % 2 else count - 1)


def test_bus_bandwidth_is_the_ring_share():
    assert bus_factor(2) == 1.0
    assert bus_factor(4) == 1.5
    assert bus_factor(1) == 0.0


HOSTS = ["n0", "n1", "n2"]


def _results(busbw, pairs):
    """Results as the module returns them; pairs: (a, b) index -> GB/s, reported by both ends."""
    out = {}
    for index, host in enumerate(HOSTS):
        mine = [{"peer": b if a == index else a, "gbps": g}
                for (a, b), g in pairs.items() if index in (a, b)]
        out[host] = {"allreduce": {"busbw": busbw, "algbw": busbw / bus_factor(3),
                                   "latency_us": 90.0, "bytes": 8 << 20, "world_size": 3,
                                   "iterations": 5},
                     "pairs": mine, "error": None}
    return out


def test_a_node_slow_with_every_peer_is_named():
    results = _results(0.002, {(0, 1): 1.1, (0, 2): 0.0015, (1, 2): 0.0014})
    verdict = judge(HOSTS, results, min_busbw=0.05)
    assert not verdict["ok"]
    assert verdict["slow_nodes"] == ["n2"] and verdict["slow_links"] == []
    (host, check, expected, found, fix), = verdict["problems"]
    assert (host, check) == ("n2", "interconnect")
    assert "0.05 GB/s" in expected and "0.002 GB/s" in found and "n0 0.0015 GB/s" in found
    assert "tc qdisc" in fix


def test_a_slow_link_between_two_nodes_is_named_as_the_link():
    results = _results(0.01, {(0, 1): 0.004, (0, 2): 1.0, (1, 2): 1.2})
    verdict = judge(HOSTS, results, min_busbw=0.05)
    assert verdict["slow_nodes"] == [] and verdict["slow_links"] == [["n0", "n1"]]
    assert verdict["problems"][0][0] == "n0 <-> n1"


def test_a_fast_cluster_passes_and_keeps_its_figures():
    results = _results(0.9, {(0, 1): 1.1, (0, 2): 1.0, (1, 2): 1.2})
    verdict = judge(HOSTS, results, min_busbw=0.05)
    assert verdict["ok"] and verdict["problems"] == []
    assert verdict["allreduce"]["busbw"] == 0.9
    assert {(p["a"], p["b"]) for p in verdict["pairs"]} == {("n0", "n1"), ("n0", "n2"),
                                                           ("n1", "n2")}


def test_the_threshold_may_be_a_share_of_the_slowest_link():
    results = _results(0.02, {(0, 1): 1.1, (0, 2): 1.0, (1, 2): 1.2})
    speeds = {"n0": 10000, "n1": 10000, "n2": 1000}
    verdict = judge(HOSTS, results, min_link_share=0.2, link_speeds=speeds)
    # 0.2 of 1000 Mb/s is 0.025 GB/s: the all-reduce is below it, while every pair alone is
    # fast: nothing to blame but contention.
    assert verdict["threshold_gbps"] == 0.025 and "n2" in verdict["threshold_why"]
    assert not verdict["ok"] and verdict["problems"][0][0] == "n0, n1, n2"
    # A node that reports no speed leaves the share without a base: figures only.
    assert judge(HOSTS, results, min_link_share=0.2, link_speeds={"n0": 10000})["ok"]


def test_a_node_that_failed_is_named_with_its_error():
    results = _results(0.9, {(0, 1): 1.1, (0, 2): 1.0, (1, 2): 1.2})
    results["n1"] = {"allreduce": None, "pairs": [], "error": "rank 1: timed out"}
    verdict = judge(HOSTS, results, min_busbw=0.05)
    assert [p[:2] for p in verdict["problems"]] == [("n1", "interconnect")]
    assert "timed out" in verdict["problems"][0][3]


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_three_ranks_measure_with_gloo_as_the_module_runs_them():
    # The file's own source through `python -c`, as the module starts it on a node.
    source = inspect.getsource(_interconnect)
    port = _free_port()
    procs = []
    for rank in range(3):
        spec = {"rank": rank, "world_size": 3, "local_rank": 0, "node_rank": rank,
                "leaders": [0, 1, 2], "backend": "gloo", "master": f"127.0.0.1:{port}",
                "timeout": 60, "bytes": 1 << 20, "iterations": 3, "latency_iterations": 5,
                "budget": 5, "pairs": True, "pair_bytes": 1 << 18, "pair_iterations": 2}
        procs.append(subprocess.Popen([sys.executable, "-c", source, json.dumps(spec)],
                                      stdout=subprocess.PIPE, text=True))
    outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert [o.get("error") for o in outs] == [None] * 3
    for out in outs:
        assert out["busbw"] > 0 and out["latency_us"] > 0 and out["world_size"] == 3
        assert sorted(p["peer"] for p in out["pairs"]) == sorted({0, 1, 2} - {out["rank"]})
    results = {host: {"allreduce": o, "pairs": o["pairs"]} for host, o in zip("abc", outs,
                                                                              strict=True)}
    verdict = judge(["a", "b", "c"], results, min_busbw=0.001)
    assert verdict["ok"], verdict["problems"]
