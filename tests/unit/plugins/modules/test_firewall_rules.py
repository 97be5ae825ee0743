"""The pure part of firewall_rules: names, rules, ownership and plans, per backend."""

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils import _firewall as fw

PEERS = fw.split_addresses(["10.0.0.3", "10.0.0.2", "fd00::0002", "10.1.0.0/16", "10.0.0.2/32"])


def spec(run_id="run-1", mode="members", ports=(), peers=PEERS):
    return fw.Spec(run_id, peers[0], peers[1], mode, fw.parse_ports(ports))


# ---------------------------------------------------------------------------------------------
# Names and input


def test_addresses_are_normalized_deduplicated_and_split_by_version():
    assert PEERS == (["10.0.0.2", "10.0.0.3", "10.1.0.0/16"], ["fd00::2"])


def test_ports_and_ranges_parse_sorted_and_bad_ones_are_refused():
    assert fw.parse_ports(["40000-40100", "29500", "29500", "41000:41001"]) == [
        (29500, 29500), (40000, 40100), (41000, 41001)]
    for bad in ("0", "70000", "5-4", "http", "1-2-3"):
        with pytest.raises(ValueError, match="port"):
            fw.parse_ports([bad])


def test_run_tags_keep_short_ids_and_cut_long_ones_distinctly():
    assert fw.run_tag("20261121-105606-985c") == "torchherd:20261121-105606-985c"
    a, b = "x" * 100, "x" * 99 + "y"
    assert fw.tag_id(a) != fw.tag_id(b)
    # An nftables comment holds 128 bytes: tag, ':' and the fingerprint always fit.
    assert len(fw.rule_comment(a, "rule")) <= 128
    assert fw.RUN_ID.match("20261121-105606-985c") and not fw.RUN_ID.match("a b")


def test_iptables_chain_names_fit_in_28_characters():
    assert fw.iptables_chain("20261121-105606-985c") == "th-20261121-105606-985c"
    long = fw.iptables_chain("a-very-long-run-id-that-does-not-fit")
    assert len(long) == 28 and long.startswith("th-a-very-long-run-")
    assert long != fw.iptables_chain("a-very-long-run-id-that-does-not-fit-either")


def test_diff_lists_lines_sorted():
    assert fw.diff(["b", "a"], []) == {"before": "a\nb\n", "after": ""}


# ---------------------------------------------------------------------------------------------
# nftables

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
    assert fw.nft_input_chains(ADMIN) == [("inet", "filter", "input"), ("ip", "guard", "in")]


def test_nft_rules_render_per_family_members_and_ports():
    members = fw.nft_rules(spec(), "inet")
    assert [text for text, _comment, _expr in members] == [
        "ip saddr { 10.0.0.2, 10.0.0.3, 10.1.0.0/16 } meta l4proto tcp accept",
        "ip6 saddr fd00::2 meta l4proto tcp accept",
    ]
    assert [text for text, _c, _e in fw.nft_rules(spec(), "ip")] == [members[0][0]]
    ports = fw.nft_rules(spec(mode="ports", ports=["29500", "40000-40100"]), "ip6")
    assert [text for text, _c, _e in ports] == [
        "ip6 saddr fd00::2 tcp dport { 29500, 40000-40100 } accept"]
    _text, comment, expr = ports[0]
    assert comment.startswith("torchherd:run-1:") and len(comment) == len("torchherd:run-1:") + 8
    assert expr[-1] == {"accept": None}
    # ports mode without ports, or no peers: nothing to allow.
    assert fw.nft_rules(spec(mode="ports"), "inet") == []
    assert fw.nft_rules(spec(peers=([], [])), "inet") == []


def existing(items, run_id, handle=100):
    """items plus the run's rules as nft would list them after the plan was applied."""
    added = [a["insert"]["rule"] for a in fw.nft_plan(items, spec(run_id), run_id).actions]
    return items + [{"rule": dict(rule, handle=handle + i)} for i, rule in enumerate(added)]


def test_nft_plan_inserts_once_then_changes_nothing_then_removes_exactly_its_rules():
    first = fw.nft_plan(ADMIN, spec(), "run-1")
    assert [list(a) for a in first.actions] == [["insert"]] * 3  # 2 families + 1 ip chain
    assert first.before == [] and len(first.after) == 3
    items = existing(existing(ADMIN, "run-1"), "run-2", handle=200)
    again = fw.nft_plan(items, spec(), "run-1")
    assert again.actions == []
    assert sorted(again.after) == sorted(again.before) == sorted(first.after)
    teardown = fw.nft_plan(items, None, "run-1")
    assert sorted(a["delete"]["rule"]["handle"] for a in teardown.actions) == [100, 101, 102]
    assert teardown.after == []


def test_nft_plan_replaces_rules_of_other_peers():
    items = existing(ADMIN, "run-1")
    fewer = fw.Spec("run-1", ["10.0.0.2"], [], "members", [])
    plan = fw.nft_plan(items, fewer, "run-1")
    assert sorted(next(iter(a)) for a in plan.actions) == ["delete"] * 3 + ["insert"] * 2
    assert "ip saddr 10.0.0.2 meta l4proto tcp accept" in plan.after[0]


def test_nft_boot_batch_holds_the_inserts():
    boot = fw.nft_boot(ADMIN, spec())
    assert len(boot) == 3 and all("insert" in command for command in boot)


# ---------------------------------------------------------------------------------------------
# iptables

DENY_S = """-P INPUT DROP
-P FORWARD ACCEPT
-P OUTPUT ACCEPT
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
"""


def test_iptables_blocking_follows_chains_and_ignores_empty_ones():
    assert fw.iptables_blocking(fw.iptables_listing(DENY_S))
    disabled_ufw = "-P INPUT ACCEPT\n-N ufw-before-input\n-A INPUT -j ufw-before-input\n"
    assert not fw.iptables_blocking(fw.iptables_listing(disabled_ufw))
    custom = disabled_ufw + "-A ufw-before-input -p tcp -j DROP\n"
    assert fw.iptables_blocking(fw.iptables_listing(custom))


def applied(text, plan):
    """`iptables -S` after an iptables-restore --noflush of the plan (what the tests need)."""
    lines = text.splitlines()
    for line in plan.actions[0].splitlines()[1:-1]:
        if line.startswith(":"):
            chain = line[1:].split()[0]
            lines = [entry for entry in lines if not entry.startswith(f"-A {chain} ")]
            lines += [] if f"-N {chain}" in lines else [f"-N {chain}"]
        elif line.startswith("-I INPUT 1 "):
            lines.append("-A INPUT " + line[len("-I INPUT 1 "):])
        elif line.startswith(("-A ", "-D ", "-F ", "-X ")):
            verb, rest = line[:2], line[3:]
            if verb == "-A":
                lines.append(line)
            elif verb == "-D":
                lines.remove("-A " + rest)
            elif verb == "-F":
                lines = [entry for entry in lines if not entry.startswith(f"-A {rest} ")]
            else:
                lines.remove(f"-N {rest}")
    return "\n".join(lines) + "\n"


def test_iptables_plan_makes_a_chain_jumped_to_from_input_and_is_idempotent():
    listing = fw.iptables_listing(DENY_S)
    first = fw.iptables_plan(listing, spec(mode="ports", ports=["29500"]), "run-1", 4)
    batch = first.actions[0]
    assert batch.startswith("*filter\n:th-run-1 - [0:0]\n") and batch.endswith("COMMIT\n")
    assert "-A th-run-1 -s 10.0.0.2/32 -p tcp -m tcp --dport 29500 -m comment --comment" in batch
    assert "-I INPUT 1 -m comment --comment torchherd:run-1 -j th-run-1" in batch
    after = applied(DENY_S, first)
    again = fw.iptables_plan(fw.iptables_listing(after), spec(mode="ports", ports=["29500"]),
                             "run-1", 4)
    assert again.actions == [] and again.after == again.before
    teardown = fw.iptables_plan(fw.iptables_listing(after), None, "run-1", 4)
    assert applied(after, teardown) == DENY_S


def test_iptables_plan_for_ipv6_takes_the_ipv6_peers_only():
    plan = fw.iptables_plan(fw.iptables_listing(DENY_S), spec(), "run-1", 6)
    assert [line.split()[4] for line in plan.after[1:]] == ["fd00::2/128"]
    assert plan.after[0].startswith("ip6tables -A INPUT")


def test_iptables_boot_restores_chain_and_jump():
    text = fw.iptables_boot(spec(), "run-1", 4)
    assert text.count("-A th-run-1 ") == 3 and "-I INPUT 1 " in text
    assert fw.iptables_boot(None, "run-1", 4) is None


# ---------------------------------------------------------------------------------------------
# ufw

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


def hexed(text):
    return text.encode().hex()


def test_ufw_rules_are_parsed_with_their_comments():
    text = USER_RULES.format(hexed("torchherd:run-1,run-2"), hexed("the admin's"))
    assert fw.ufw_parse(text, 4) == [
        ((4, "0.0.0.0/0", "22"), ""),
        ((4, "10.0.0.2", "any"), "torchherd:run-1,run-2"),
        ((4, "10.0.0.3", "any"), "the admin's"),
    ]


def test_ufw_ports_split_into_rules_of_at_most_15_ports():
    ports = [str(p) for p in range(30000, 30014)] + ["40000-40100", "50000"]
    keys = fw.ufw_keys(spec(mode="ports", ports=ports, peers=(["10.0.0.2"], [])))
    assert [k[2] for k in keys] == [
        ",".join(str(p) for p in range(30000, 30014)), "40000:40100,50000"]


def test_ufw_runs_share_identical_rules_and_the_last_one_deletes_them():
    one_peer = (["10.0.0.2"], [])
    key = (4, "10.0.0.2", "any")
    first = fw.ufw_plan([], spec(peers=one_peer), "run-1")
    assert first.actions == [("allow", key, "torchherd:run-1")]
    second = fw.ufw_plan([(key, "torchherd:run-1")], spec("run-2", peers=one_peer), "run-2")
    assert second.actions == [("allow", key, "torchherd:run-1,run-2")]
    assert second.before == []
    again = fw.ufw_plan([(key, "torchherd:run-1,run-2")], spec(peers=one_peer), "run-1")
    assert again.actions == [] and again.before == again.after
    leave = fw.ufw_plan([(key, "torchherd:run-1,run-2")], None, "run-1")
    assert leave.actions == [("allow", key, "torchherd:run-2")]
    last = fw.ufw_plan([(key, "torchherd:run-2")], None, "run-2")
    assert last.actions == [("delete", key, "torchherd:run-2")]
    assert fw.ufw_argv(key, "torchherd:run-2") == [
        "proto", "tcp", "from", "10.0.0.2", "to", "any", "comment", "torchherd:run-2"]


def test_ufw_leaves_the_admins_identical_rule_alone():
    key = (4, "10.0.0.2", "any")
    plan = fw.ufw_plan([(key, "")], spec(peers=(["10.0.0.2"], [])), "run-1")
    assert plan.actions == [] and plan.after == [] and "not made by torchherd" in plan.note
    assert fw.ufw_plan([(key, "")], None, "run-1").actions == []


# ---------------------------------------------------------------------------------------------
# firewalld

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
    zones = fw.firewalld_zones(ZONES)
    assert zones["public"] == {"interfaces": ["eth0"], "sources": [],
                               "rich": ['rule family="ipv4" source address="10.9.9.9" accept']}
    assert fw.firewalld_zone("10.1.2.3", zones, "home", "eth1") == "trusted"
    assert fw.firewalld_zone("10.0.0.2", zones, "home", "eth0") == "public"
    assert fw.firewalld_zone("10.0.0.2", zones, "home", "eth1") == "home"


def test_rich_rules_per_peer_and_port():
    rules = [rule for _address, rule in fw.rich_rules(spec(mode="ports", ports=["29500", "1-2"]))]
    assert rules[0] == ('rule family="ipv4" source address="10.0.0.2" port port="1-2" '
                        'protocol="tcp" accept')
    assert rules[-1] == ('rule family="ipv6" source address="fd00::2" port port="29500" '
                         'protocol="tcp" accept')
    assert len(rules) == 8
    assert fw.rich_rules(spec(peers=(["10.0.0.2"], [])))[0][1] == (
        'rule family="ipv4" source address="10.0.0.2" protocol value="tcp" accept')


RULE = 'rule family="ipv4" source address="10.0.0.2" protocol value="tcp" accept'


def ledger(run_id, owned=True, permanent=False):
    return {"run_id": run_id, "permanent": permanent,
            "rules": [{"zone": "public", "rule": RULE, "owned": owned}]}


def test_firewalld_rules_are_shared_through_ledgers_and_removed_by_the_last_run():
    wanted = [("public", RULE)]
    first = fw.firewalld_plan(wanted, {}, None, {}, "run-1", False)
    assert first.actions == [("runtime", "add", "public", RULE),
                             ("ledger", "run-1", ledger("run-1"))]
    runtime = {"public": [RULE]}
    second = fw.firewalld_plan(wanted, runtime, None, {"run-1": ledger("run-1")}, "run-2", False)
    assert second.actions == [("ledger", "run-2", ledger("run-2"))]
    both = {"run-1": ledger("run-1"), "run-2": ledger("run-2")}
    assert fw.firewalld_plan(wanted, runtime, None, both, "run-1", False).actions == []
    leave = fw.firewalld_plan([], runtime, None, both, "run-1", False)
    assert leave.actions == [("ledger", "run-1", None)]
    last = fw.firewalld_plan([], runtime, None, {"run-2": ledger("run-2")}, "run-2", False)
    assert last.actions == [("runtime", "remove", "public", RULE), ("ledger", "run-2", None)]


def test_firewalld_never_removes_a_rule_that_was_there_before():
    runtime = {"public": [RULE]}
    plan = fw.firewalld_plan([("public", RULE)], runtime, None, {}, "run-1", False)
    assert plan.actions == [("ledger", "run-1", ledger("run-1", owned=False))]
    mine = {"run-1": ledger("run-1", owned=False)}
    assert fw.firewalld_plan([], runtime, None, mine, "run-1", False).actions == [
        ("ledger", "run-1", None)]


def test_firewalld_persistent_rules_go_to_the_permanent_config_and_leave_it_at_teardown():
    plan = fw.firewalld_plan([("public", RULE)], {}, {}, {}, "run-1", True)
    assert ("permanent", "add", "public", RULE) in plan.actions
    assert "(runtime and permanent)" in plan.after[0]
    kept = {"run-1": ledger("run-1", permanent=True)}
    teardown = fw.firewalld_plan([], {"public": [RULE]}, {"public": [RULE]}, kept, "run-1", False)
    assert ("runtime", "remove", "public", RULE) in teardown.actions
    assert ("permanent", "remove", "public", RULE) in teardown.actions


# ---------------------------------------------------------------------------------------------
# Choosing


@pytest.mark.parametrize(("found", "chosen"), [
    ((False, False, False, False), []),
    ((False, False, True, False), ["nftables"]),
    ((False, False, True, True), ["nftables", "iptables"]),
    ((False, True, False, True), ["ufw"]),  # ufw's rules live in iptables
    ((True, True, False, True), ["firewalld"]),
    ((False, True, True, True), ["ufw", "nftables"]),  # an admin's own nft table filters too
])
def test_every_firewall_that_can_drop_the_jobs_packets_gets_the_rules(found, chosen):
    assert fw.choose_backends(*found) == chosen
