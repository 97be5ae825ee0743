"""Each node's run-state record on the controller (run_state): the newest copy, which nodes are
lost, and which still hold the run's firewall rules once the watch is over."""

import json

from ansible_collections.torchherd.cluster.plugins.filter.run_state import UNKNOWN, run_state
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    read_record,
    rules_open,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record

RULES = ["tcp dport 29500 ip saddr 10.0.0.2 accept"]
OPENED = {"seq": 2, "firewall": {"opened_by": "start", "rules": RULES}}
CLOSED = {"seq": 5, "firewall": {"opened_by": "start", "rules": RULES,
                                 "closed_by": "supervisor", "error": None}}


def left(nodes_dir="", **hostvars):
    states = run_state(list(hostvars), hostvars, nodes_dir=nodes_dir)
    return [h for h, s in states.items() if s["rules_open"] and not s["lost"]]


def test_the_record_is_written_one_transition_at_a_time(tmp_path):
    paths = {"dir": str(tmp_path / "runs" / "r1")}
    record(paths, "firewall", opened_by="start", rules=RULES)
    record(paths, "job", started_at=1.0, pid=42)
    found = read_record(paths)
    assert found["seq"] == 2 and found["job"] == {"started_at": 1.0, "pid": 42}
    assert rules_open(found) == RULES
    record(paths, "firewall", closed_by="supervisor", error=None)
    assert rules_open(read_record(paths)) == []
    record(paths, "firewall", closed_by="wait", error="nft: busy")
    assert rules_open(read_record(paths)) == RULES


def test_the_start_opened_and_the_supervisor_removed_them():
    assert left(a={"torchherd_firewall": {"skipped": True},
                   "torchherd_start": {"record": OPENED},
                   "torchherd_watch": {"job_state": "succeeded", "record": CLOSED}}) == []


def test_the_removal_failed():
    failed = {"seq": 6, "firewall": dict(CLOSED["firewall"], closed_by="wait", error="nft: no")}
    assert left(a={"torchherd_firewall": {"skipped": True},
                   "torchherd_start": {"record": OPENED},
                   "torchherd_watch": {"record": failed}}) == ["a"]


def test_the_start_opened_them_and_no_word_of_their_removal_came_back():
    assert left(a={"torchherd_firewall": {"skipped": True},
                   "torchherd_start": {"record": OPENED},
                   "torchherd_watch": {"job_state": "failed"}}) == ["a"]


def test_the_firewall_role_added_rules():
    assert left(a={"torchherd_firewall": {"changed": True, "rules": RULES},
                   "torchherd_start": {"started": True},
                   "torchherd_watch": {"job_state": "succeeded"}}) == ["a"]


def test_nothing_was_added_anywhere():
    assert left(a={"torchherd_firewall": {"rules": []}, "torchherd_start": {}},
                b={"torchherd_firewall": {"skipped": True}, "torchherd_start": {}}) == []


def test_a_failed_firewall_role_or_an_unknown_phase_is_torn_down():
    states = run_state(["a", "b"], {"a": {"torchherd_firewall": {"failed": True}},
                                    "b": {"torchherd_start": {}}})
    assert states["a"]["rules_open"] == states["b"]["rules_open"] == [UNKNOWN]


def test_a_lost_node_is_left_for_stop_or_collect():
    states = run_state(["a"], {"a": {"torchherd_firewall": {"changed": True, "rules": RULES},
                                     "torchherd_watch": {"unreachable": True}}})
    assert states["a"]["lost"] and states["a"]["lost_why"] == "no answer over SSH (watch)"
    assert states["a"]["rules_open"] == RULES  # kept: stop or collect of the run id remove them


def test_the_collected_record_is_the_newest_word(tmp_path):
    """The watch waited on the master alone: the others' supervisors removed the start's rules
    when their jobs ended, and collect brought their records back."""
    opened = {"torchherd_firewall": {"skipped": True}, "torchherd_start": {"record": OPENED}}
    failed = dict(CLOSED, firewall=dict(CLOSED["firewall"], error="nft: permission denied"))
    for host, said in (("a", CLOSED), ("b", failed)):
        (tmp_path / host).mkdir()
        (tmp_path / host / "run.json").write_text(json.dumps(said))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "run.json").write_text("{not json")
    hostvars = {"a": opened, "b": opened, "c": opened, "d": opened}
    # b: the removal failed; c: no word (its supervisor was killed, or collect missed it);
    # d: an unreadable word.
    assert left(str(tmp_path), **hostvars) == ["b", "c", "d"]
    # Without the collected directory nothing is taken on trust.
    assert left(**hostvars) == ["a", "b", "c", "d"]
    # An older copy does not win over a newer one, wherever it comes from.
    stale = dict(opened, torchherd_watch={"record": dict(OPENED, seq=1)})
    assert left(str(tmp_path), a=stale) == []


def test_a_node_the_masters_gang_lost_is_lost_and_left_out():
    opened = {"torchherd_firewall": {"skipped": True}, "torchherd_start": {"record": OPENED}}
    master = dict(opened, torchherd_watch={"record": dict(CLOSED, gang={"joined": 2,
                                                                       "expected": 2,
                                                                       "lost": ["b"]})})
    states = run_state(["m", "b", "c"], {"m": master, "b": opened, "c": opened})
    assert [h for h, s in states.items() if s["lost"]] == ["b"]
    assert states["b"]["lost_why"].startswith("its link to the master's gang closed")
    assert [h for h, s in states.items() if s["rules_open"] and not s["lost"]] == ["c"]


def test_a_role_that_ended_before_its_task_opened_nothing_of_its_own():
    """The firewall role ends on a node in its first task (a meta task, no result) where the
    plan gives the node no firewall, or the start opens the rules itself: the plan and the
    start's answer say which, and the record what the start opened and removed."""
    enabled, disabled = ({"torchherd_node": {"firewall": {"enabled": on}}} for on in (True, False))
    by_start = dict(enabled, torchherd_start={"firewall": {"rules": RULES}, "record": OPENED})
    assert left(a=dict(by_start, torchherd_watch={"record": CLOSED}),
                b=dict(disabled, torchherd_start={"started": True})) == []
    # No word of the removal came back: the start's rules are still there.
    assert left(a=by_start, b=dict(disabled, torchherd_start={})) == ["a"]
    # A node with a firewall whose rules nobody spoke of (the start never came to it).
    states = run_state(["a"], {"a": dict(enabled, torchherd_start={})})
    assert states["a"]["rules_open"] == [UNKNOWN]
