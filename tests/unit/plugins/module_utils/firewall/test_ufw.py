"""ufw: its rules files, the runs sharing one rule, and the admin's rules left alone."""

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import ufw

USER_RULES = """*filter
### RULES ###

### tuple ### allow tcp 22 0.0.0.0/0 any 0.0.0.0/0 in
-A ufw-user-input -p tcp --dport 22 -j ACCEPT

### tuple ### allow tcp any 0.0.0.0/0 any 10.0.0.2 in comment={}
-A ufw-user-input -p tcp -s 10.0.0.2 -j ACCEPT

### tuple ### allow tcp any 0.0.0.0/0 any 10.0.0.3 in comment={}
-A ufw-user-input -p tcp -s 10.0.0.3 -j ACCEPT

### tuple ### allow any 22 0.0.0.0/0 any 0.0.0.0/0 OpenSSH - in
### END RULES ###
"""
ONE_PEER = (["10.0.0.2"], [])


def hexed(text):
    return text.encode().hex()


def test_ufw_rules_are_parsed_with_their_comments():
    text = USER_RULES.format(hexed("torchherd:run-1,run-2"), hexed("the admin's"))
    assert ufw.ufw_parse(text, 4) == [
        ((4, "0.0.0.0/0", "22"), ""),
        ((4, "10.0.0.2", "any"), "torchherd:run-1,run-2"),
        ((4, "10.0.0.3", "any"), "the admin's"),
    ]


def test_ufw_ports_split_into_rules_of_at_most_15_ports(spec):
    ports = [str(p) for p in range(30000, 30014)] + ["40000-40100", "50000"]
    keys = ufw.ufw_keys(spec(mode="ports", ports=ports, peers=ONE_PEER))
    assert [k[2] for k in keys] == [
        ",".join(str(p) for p in range(30000, 30014)), "40000:40100,50000"]


def test_ufw_runs_share_identical_rules_and_the_last_one_deletes_them(spec):
    key = (4, "10.0.0.2", "any")
    first = ufw.ufw_plan([], spec(peers=ONE_PEER), "run-1")
    assert first.actions == [("allow", key, "torchherd:run-1")]
    second = ufw.ufw_plan([(key, "torchherd:run-1")], spec("run-2", peers=ONE_PEER), "run-2")
    assert second.actions == [("allow", key, "torchherd:run-1,run-2")]
    assert second.before == []
    again = ufw.ufw_plan([(key, "torchherd:run-1,run-2")], spec(peers=ONE_PEER), "run-1")
    assert again.actions == [] and again.before == again.after
    leave = ufw.ufw_plan([(key, "torchherd:run-1,run-2")], None, "run-1")
    assert leave.actions == [("allow", key, "torchherd:run-2")]
    last = ufw.ufw_plan([(key, "torchherd:run-2")], None, "run-2")
    assert last.actions == [("delete", key, "torchherd:run-2")]
    assert ufw.ufw_argv(key, "torchherd:run-2") == [
        "proto", "tcp", "from", "10.0.0.2", "to", "any", "comment", "torchherd:run-2"]


def test_ufw_leaves_the_admins_identical_rule_alone(spec):
    key = (4, "10.0.0.2", "any")
    plan = ufw.ufw_plan([(key, "")], spec(peers=ONE_PEER), "run-1")
    assert plan.actions == [] and plan.after == [] and "not made by torchherd" in plan.note
    assert ufw.ufw_plan([(key, "")], None, "run-1").actions == []
