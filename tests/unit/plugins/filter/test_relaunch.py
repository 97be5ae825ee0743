"""A relaunch's start in its facts call, on the controller's side and the node's: the last
launch of the same job found in the runs directory (only one whose preflight passed), the
start computed from its verdict, and the node's own check of its fresh facts against it."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from ansible_collections.torchherd.cluster.plugins.filter.facts_args import facts_args
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.spec import ARGUMENT_SPEC
from ansible_collections.torchherd.cluster.plugins.module_utils._relaunch import (
    FINGERPRINTED,
    changed,
    fingerprints,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils import _prior
from ansible_collections.torchherd.cluster.plugins.plugin_utils._answers import answer, with_facts
from tests.unit.plugins.filter.test_node_args import gate
from tests.unit.plugins.filter.test_schedule import HOSTS, planned, schedule

FACTS = {
    "hostname": "n0", "euid": 0, "root": "/var/tmp/torchherd", "venv": None, "container": None,
    "python": {"path": "/usr/bin/python3", "version": "3.11.2", "error": None},
    "torch": {"version": "2.13.0+cpu", "gpus": [], "cached": True},
    "cuda_visible_devices": None, "addresses": {"eth0": ["10.0.0.1"]},
    "interface": {"name": "eth0", "address": "10.0.0.1"}, "port_free": None,
    "port_picked": 29511, "rsync": "/usr/bin/rsync", "py_spy": None, "gpu_processes": None,
    "xid": None, "boot_id": "b1", "shm_bytes": 8 << 30, "memlock": 65536, "infiniband": {},
    "gpu_nics": {}, "disk_free_bytes": 50 << 30, "code_current": True, "code_hash": "h",
    "running_jobs": {}, "warm": {"started": True, "pid": 42},
}
EXPECT = {"facts": fingerprints(FACTS), "min_free_bytes": 1 << 30}


def test_unchanged_facts_may_start_whatever_changes_from_launch_to_launch():
    fresh = dict(copy.deepcopy(FACTS), disk_free_bytes=40 << 30, warm={"started": True, "pid": 7},
                 running_jobs={"/var/tmp/torchherd/runs/other": [99]}, code_hash="h2")
    fresh["torch"]["cached"] = False
    assert changed(fresh, EXPECT) is None


def test_each_fact_the_gate_judges_is_named_where_it_changed():
    for key in FINGERPRINTED:
        fresh = dict(copy.deepcopy(FACTS), **{key: "something else"})
        assert changed(fresh, EXPECT) == f"changed since the last launch: {key}", key
    fresh = copy.deepcopy(FACTS)
    fresh["torch"]["version"] = "2.12.0"
    fresh["euid"] = 1000
    assert changed(fresh, EXPECT) == "changed since the last launch: euid, torch"


def test_the_code_and_the_disk_are_held_to_the_controllers_and_the_gates_own():
    assert changed(dict(FACTS, code_current=False), EXPECT) == \
        "the code on the node is not the controller's"
    assert "below the gate's" in changed(dict(FACTS, disk_free_bytes=1 << 20), EXPECT)
    # A fingerprint the node cannot match (a controller of another version, say) refuses.
    assert changed(FACTS, {"facts": {}}).startswith("changed since the last launch: hostname")


def _judged(runs: Path, run_id: str, ok=True, facts=None, hosts=HOSTS):
    (runs / run_id).mkdir(parents=True)
    verdict = dict(gate(planned()), ok=ok)
    (runs / run_id / "preflight.json").write_text(json.dumps(
        {"gate": verdict, "facts": facts or {h: dict(FACTS, hostname=h) for h in hosts}}))


def test_the_last_launch_of_the_same_job_is_found_only_where_its_preflight_passed(tmp_path):
    p = planned()
    key = _prior.job_key(p, "code1")
    assert _prior.find(str(tmp_path), key, HOSTS) is None
    _judged(tmp_path, "r0")
    _prior.point(str(tmp_path), key, "r0")
    found = _prior.find(str(tmp_path), key, HOSTS)
    assert found["run_id"] == "r0" and set(found["facts"]) == set(HOSTS)
    assert set(found["gate"]) == set(_prior.GATE_KEYS)
    assert found["expect"]["n1"]["facts"] == fingerprints(dict(FACTS, hostname="n1"))
    # The same job relaunched: another run id and times, the same key.
    assert _prior.job_key(dict(p, run_id="r9", started_at=5.0, restart=0), "code1") == key
    assert _prior.job_key(dict(p, job=dict(p["job"], run_id="r9")), "code1") == key
    # Other code, another job, other nodes: another key.
    assert _prior.job_key(p, "code2") != key
    assert _prior.job_key(planned(nproc_per_node=3), "code1") != key
    # A verdict that failed, a node that did not answer, a node it did not judge: none.
    _judged(tmp_path, "r1", ok=False)
    _prior.point(str(tmp_path), key, "r1")
    assert _prior.find(str(tmp_path), key, HOSTS) is None
    _judged(tmp_path, "r2", facts={h: {"unreachable": True} for h in HOSTS})
    _prior.point(str(tmp_path), key, "r2")
    assert _prior.find(str(tmp_path), key, HOSTS) is None
    _prior.point(str(tmp_path), key, "r0")
    assert _prior.find(str(tmp_path), key, HOSTS + ["n9"]) is None
    # A pruned run: none.
    (tmp_path / "r0" / "preflight.json").unlink()
    assert _prior.find(str(tmp_path), key, HOSTS) is None


def test_the_start_comes_with_the_facts_computed_from_the_last_verdict(tmp_path):
    p = planned()
    p["master"]["port"] = "auto"
    _judged(tmp_path, "r0")
    key = _prior.job_key(p, "c")
    _prior.point(str(tmp_path), key, "r0")
    prior = _prior.find(str(tmp_path), key, HOSTS)
    s = schedule(p, 4, prior=prior)
    assert s["start"]["with_facts"]
    master, other = (facts_args(p, s, p["nodes"][i], {}, p["nodes"][i]["host"], 0, prior=prior,
                                grace=10) for i in (0, 1))
    start = master["start"]
    assert set(start) <= set(ARGUMENT_SPEC)
    assert start["state"] == "started" and start["run_id"] == p["run_id"]
    assert start["master_port"] == 29511 and start["barrier"]["listen"]
    assert start["grace"] == 10 and start["warm"] is True
    assert master["start_expect"] == prior["expect"]["n0"]
    # The master picks the port the starts were computed for, where it is still free.
    assert master["prefer_port"] == 29511 and "prefer_port" not in other
    assert not other["start"]["barrier"]["listen"]
    # Without the schedule's word, no start comes with the facts.
    plain = facts_args(p, schedule(p, 4), p["nodes"][0], {}, "n0", 0, prior=prior, grace=10)
    assert "start" not in plain and "start_expect" not in plain


def test_the_start_with_the_facts_is_the_nodes_start_until_the_start_task_answers():
    went = {"started": True, "probe": {"go": True}}
    hv = {"torchherd_facts": {"start": went}}
    assert answer(hv, "torchherd_start") == went
    assert answer(dict(hv, torchherd_start={"started": True, "pid": 5}),
                  "torchherd_start") == {"started": True, "pid": 5}
    assert answer({"torchherd_facts": {}}, "torchherd_start") == {}
    assert answer(hv, "torchherd_watch") == {}
    hostvars = {"n0": {"torchherd_facts": {"start": {"started": False, "probe": {
        "refused_here": "changed since the last launch: torch", "error": "called off"}}}},
        "n1": {"torchherd_facts": {"start": {"started": False, "probe": {"error": "called off"}}}}}
    assert with_facts(["n0", "n1"], hostvars) == {
        "started": False, "refused": {"n0": "changed since the last launch: torch"},
        "called_off": "called off"}
    assert with_facts(["n0"], {"n0": hv["torchherd_facts"] and hv}) == {
        "started": True, "refused": {}, "called_off": None}
    assert with_facts(["n0"], {"n0": {"torchherd_facts": {}}}) is None
