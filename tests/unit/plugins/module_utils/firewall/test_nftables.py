"""nftables: which chains get the run's rules, how they read, and the plans between."""

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import nftables as nft
from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.common import Spec

ADMIN = [
    {"table": {"family": "inet", "name": "filter", "handle": 1}},
    {"chain": {"family": "inet", "table": "filter", "name": "input", "handle": 1,
               "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
    {"chain": {"family": "inet", "table": "filter", "name": "output", "handle": 2,
               "type": "filter", "hook": "output", "prio": 0, "policy": "accept"}},
    # iptables-nft's table: the iptables backend's, never edited with nft.
    {"chain": {"family": "ip", "table": "filter", "name": "INPUT", "handle": 1,
               "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
    # A chain that accepts everything needs nothing.
    {"chain": {"family": "ip6", "table": "open", "name": "in", "handle": 1,
               "type": "filter", "hook": "input", "prio": 0, "policy": "accept"}},
    # A chain with an accept policy but a drop rule needs the rules.
    {"chain": {"family": "ip", "table": "guard", "name": "in", "handle": 1,
               "type": "filter", "hook": "input", "prio": 10, "policy": "accept"}},
    {"rule": {"family": "ip", "table": "guard", "chain": "in", "handle": 2,
              "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "tcp",
                                                                    "field": "dport"}},
                                  "right": 23}}, {"drop": None}]}},
]


def test_nft_rules_go_to_every_input_chain_that_can_drop_in_the_admins_tables():
    assert nft.nft_input_chains(ADMIN) == [("inet", "filter", "input"), ("ip", "guard", "in")]


def test_nft_rules_render_per_family_members_and_ports(spec):
    members = nft.nft_rules(spec(), "inet")
    assert [text for text, _comment, _expr in members] == [
        "ip saddr { 10.0.0.2, 10.0.0.3, 10.1.0.0/16 } meta l4proto tcp accept",
        "ip6 saddr fd00::2 meta l4proto tcp accept",
    ]
    assert [text for text, _c, _e in nft.nft_rules(spec(), "ip")] == [members[0][0]]
    ports = nft.nft_rules(spec(mode="ports", ports=["29500", "40000-40100"]), "ip6")
    assert [text for text, _c, _e in ports] == [
        "ip6 saddr fd00::2 tcp dport { 29500, 40000-40100 } accept"]
    _text, comment, expr = ports[0]
    assert comment.startswith("torchherd:run-1:") and len(comment) == len("torchherd:run-1:") + 8
    assert expr[-1] == {"accept": None}
    # ports mode without ports, or no peers: nothing to allow.
    assert nft.nft_rules(spec(mode="ports"), "inet") == []
    assert nft.nft_rules(spec(peers=([], [])), "inet") == []


def existing(items, wanted, handle=100):
    """items plus the rules of wanted's run as nft would list them after the plan was applied."""
    added = [a["insert"]["rule"] for a in nft.nft_plan(items, wanted, wanted.run_id).actions]
    return items + [{"rule": dict(rule, handle=handle + i)} for i, rule in enumerate(added)]


def test_nft_plan_inserts_once_then_changes_nothing_then_removes_exactly_its_rules(spec):
    first = nft.nft_plan(ADMIN, spec(), "run-1")
    assert [list(a) for a in first.actions] == [["insert"]] * 3  # 2 families + 1 ip chain
    assert first.before == [] and len(first.after) == 3
    items = existing(existing(ADMIN, spec("run-1")), spec("run-2"), handle=200)
    again = nft.nft_plan(items, spec(), "run-1")
    assert again.actions == []
    assert sorted(again.after) == sorted(again.before) == sorted(first.after)
    teardown = nft.nft_plan(items, None, "run-1")
    assert sorted(a["delete"]["rule"]["handle"] for a in teardown.actions) == [100, 101, 102]
    assert teardown.after == []


def test_nft_plan_replaces_rules_of_other_peers(spec):
    items = existing(ADMIN, spec("run-1"))
    fewer = Spec("run-1", ["10.0.0.2"], [], "members", [])
    plan = nft.nft_plan(items, fewer, "run-1")
    assert sorted(next(iter(a)) for a in plan.actions) == ["delete"] * 3 + ["insert"] * 2
    assert "ip saddr 10.0.0.2 meta l4proto tcp accept" in plan.after[0]


def test_nft_boot_batch_holds_the_inserts(spec):
    boot = nft.nft_boot(ADMIN, spec())
    assert len(boot) == 3 and all("insert" in command for command in boot)
