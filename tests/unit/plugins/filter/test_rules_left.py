"""Which nodes still hold the run's firewall rules once the watch is over (rules_left)."""

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
