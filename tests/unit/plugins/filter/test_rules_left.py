"""Which nodes still hold the run's firewall rules once the watch is over (rules_left)."""

import json

from ansible_collections.torchherd.cluster.plugins.filter.rules_left import rules_left

RULES = ["tcp dport 29500 ip saddr 10.0.0.2 accept"]


def left(**hostvars):
    return rules_left(list(hostvars), hostvars)


def test_the_start_opened_and_the_last_wait_removed_them():
    assert left(a={"torchherd_firewall": {"skipped": True},
                   "torchherd_start": {"firewall": {"rules": RULES}},
                   "torchherd_watch": {"job_state": "succeeded",
                                       "firewall": {"changed": True, "rules": RULES}}}) == []


def test_the_wait_failed_to_remove_them():
    assert left(a={"torchherd_firewall": {"skipped": True},
                   "torchherd_start": {"firewall": {"rules": RULES}},
                   "torchherd_watch": {"firewall": {"error": "nft: permission denied"}}}) == ["a"]


def test_the_start_opened_them_and_the_job_was_stopped_before_any_wait_saw_it_end():
    # A failed start or a gang stop: the watch result has no firewall entry.
    assert left(a={"torchherd_firewall": {"skipped": True},
                   "torchherd_start": {"firewall": {"rules": RULES}},
                   "torchherd_watch": {"job_state": "failed"}}) == ["a"]


def test_the_firewall_role_added_rules():
    assert left(a={"torchherd_firewall": {"changed": True, "rules": RULES},
                   "torchherd_start": {"started": True},
                   "torchherd_watch": {"job_state": "succeeded"}}) == ["a"]


def test_nothing_was_added_anywhere():
    assert left(a={"torchherd_firewall": {"rules": []}, "torchherd_start": {}},
                b={"torchherd_firewall": {"skipped": True}, "torchherd_start": {}}) == []


def test_a_failed_firewall_role_or_an_unknown_phase_is_torn_down():
    assert left(a={"torchherd_firewall": {"failed": True, "msg": "no nft"}},
                b={"torchherd_start": {}}) == ["a", "b"]


def test_a_lost_node_is_left_for_stop_or_collect():
    assert left(a={"torchherd_firewall": {"changed": True, "rules": RULES},
                   "torchherd_watch": {"unreachable": True}}) == []


def test_a_node_the_watch_did_not_wait_on_is_clean_by_its_supervisors_word(tmp_path):
    """The watch waited on the master alone: the others' supervisors removed the start's rules
    when their jobs ended, and collect brought their firewall.json back."""
    opened = {"torchherd_firewall": {"skipped": True},
              "torchherd_start": {"firewall": {"rules": RULES}}}
    for host, said in (("a", {"changed": True, "rules": RULES}),
                       ("b", {"changed": False, "error": "nft: permission denied"})):
        (tmp_path / host).mkdir()
        (tmp_path / host / "firewall.json").write_text(json.dumps(said))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "firewall.json").write_text("{not json")
    hostvars = {"a": opened, "b": opened, "c": opened, "d": opened}
    # b: the removal failed; c: no word (its supervisor was killed, or collect missed it);
    # d: an unreadable word.
    assert rules_left(list(hostvars), hostvars, nodes_dir=str(tmp_path)) == ["b", "c", "d"]
    # Without the collected directory nothing is taken on trust.
    assert rules_left(list(hostvars), hostvars) == ["a", "b", "c", "d"]
    # The wait's own word wins where there is one.
    waited = dict(opened, torchherd_watch={"firewall": {"error": "ufw: busy"}})
    assert rules_left(["a"], {"a": waited}, nodes_dir=str(tmp_path)) == ["a"]


def test_a_node_the_masters_gang_lost_is_left_out():
    opened = {"torchherd_firewall": {"skipped": True},
              "torchherd_start": {"firewall": {"rules": RULES}}}
    hostvars = {"m": dict(opened, torchherd_watch={"firewall": {"rules": []},
                                                   "gang_lost": ["b"]}),
                "b": opened, "c": opened}
    assert rules_left(list(hostvars), hostvars) == ["c"]
