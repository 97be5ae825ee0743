"""firewalld: zones, rich rules, and the ledgers that say which run owns a rule."""

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import firewalld as fwd

ZONES = """public (active)
  target: default
  interfaces: eth0
  sources:
  services: dhcpv6-client ssh
  rich rules:
\trule family="ipv4" source address="10.9.9.9" accept

trusted
  target: ACCEPT
  interfaces:
  sources: 10.1.0.0/16 ipset:blocked
  rich rules:
"""


def test_firewalld_zones_and_the_zone_of_each_peer():
    zones = fwd.firewalld_zones(ZONES)
    assert zones["public"] == {"interfaces": ["eth0"], "sources": [],
                               "rich": ['rule family="ipv4" source address="10.9.9.9" accept']}
    assert fwd.firewalld_zone("10.1.2.3", zones, "home", "eth1") == "trusted"
    assert fwd.firewalld_zone("10.0.0.2", zones, "home", "eth0") == "public"
    assert fwd.firewalld_zone("10.0.0.2", zones, "home", "eth1") == "home"


def test_rich_rules_per_peer_and_port(spec):
    rules = [rule for _address, rule in fwd.rich_rules(spec(mode="ports", ports=["29500", "1-2"]))]
    assert rules[0] == ('rule family="ipv4" source address="10.0.0.2" port port="1-2" '
                        'protocol="tcp" accept')
    assert rules[-1] == ('rule family="ipv6" source address="fd00::2" port port="29500" '
                         'protocol="tcp" accept')
    assert len(rules) == 8
    assert fwd.rich_rules(spec(peers=(["10.0.0.2"], [])))[0][1] == (
        'rule family="ipv4" source address="10.0.0.2" protocol value="tcp" accept')


RULE = 'rule family="ipv4" source address="10.0.0.2" protocol value="tcp" accept'


def ledger(run_id, owned=True, permanent=False):
    return {"run_id": run_id, "permanent": permanent,
            "rules": [{"zone": "public", "rule": RULE, "owned": owned}]}


def test_firewalld_rules_are_shared_through_ledgers_and_removed_by_the_last_run():
    wanted = [("public", RULE)]
    first = fwd.firewalld_plan(wanted, {}, None, {}, "run-1", False)
    assert first.actions == [("runtime", "add", "public", RULE),
                             ("ledger", "run-1", ledger("run-1"))]
    runtime = {"public": [RULE]}
    second = fwd.firewalld_plan(wanted, runtime, None, {"run-1": ledger("run-1")}, "run-2", False)
    assert second.actions == [("ledger", "run-2", ledger("run-2"))]
    both = {"run-1": ledger("run-1"), "run-2": ledger("run-2")}
    assert fwd.firewalld_plan(wanted, runtime, None, both, "run-1", False).actions == []
    leave = fwd.firewalld_plan([], runtime, None, both, "run-1", False)
    assert leave.actions == [("ledger", "run-1", None)]
    last = fwd.firewalld_plan([], runtime, None, {"run-2": ledger("run-2")}, "run-2", False)
    assert last.actions == [("runtime", "remove", "public", RULE), ("ledger", "run-2", None)]


def test_firewalld_never_removes_a_rule_that_was_there_before():
    runtime = {"public": [RULE]}
    plan = fwd.firewalld_plan([("public", RULE)], runtime, None, {}, "run-1", False)
    assert plan.actions == [("ledger", "run-1", ledger("run-1", owned=False))]
    mine = {"run-1": ledger("run-1", owned=False)}
    assert fwd.firewalld_plan([], runtime, None, mine, "run-1", False).actions == [
        ("ledger", "run-1", None)]


def test_firewalld_persistent_rules_go_to_the_permanent_config_and_leave_it_at_teardown():
    plan = fwd.firewalld_plan([("public", RULE)], {}, {}, {}, "run-1", True)
    assert ("permanent", "add", "public", RULE) in plan.actions
    assert "(runtime and permanent)" in plan.after[0]
    kept = {"run-1": ledger("run-1", permanent=True)}
    teardown = fwd.firewalld_plan([], {"public": [RULE]}, {"public": [RULE]}, kept, "run-1", False)
    assert ("runtime", "remove", "public", RULE) in teardown.actions
    assert ("permanent", "remove", "public", RULE) in teardown.actions
