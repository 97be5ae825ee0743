"""iptables: the run's own chain, when INPUT can drop, and the iptables-restore batches."""

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import iptables as ipt

DENY_S = """-P INPUT DROP
-P FORWARD ACCEPT
-P OUTPUT ACCEPT
-A INPUT -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT
"""


def test_iptables_chain_names_fit_in_28_characters():
    assert ipt.iptables_chain("20261121-105606-985c") == "th-20261121-105606-985c"
    long = ipt.iptables_chain("a-very-long-run-id-that-does-not-fit")
    assert len(long) == 28 and long.startswith("th-a-very-long-run-")
    assert long != ipt.iptables_chain("a-very-long-run-id-that-does-not-fit-either")


def test_iptables_blocking_follows_chains_and_ignores_empty_ones():
    assert ipt.iptables_blocking(ipt.iptables_listing(DENY_S))
    disabled_ufw = "-P INPUT ACCEPT\n-N ufw-before-input\n-A INPUT -j ufw-before-input\n"
    assert not ipt.iptables_blocking(ipt.iptables_listing(disabled_ufw))
    custom = disabled_ufw + "-A ufw-before-input -p tcp -j DROP\n"
    assert ipt.iptables_blocking(ipt.iptables_listing(custom))


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


def test_iptables_plan_makes_a_chain_jumped_to_from_input_and_is_idempotent(spec):
    listing = ipt.iptables_listing(DENY_S)
    first = ipt.iptables_plan(listing, spec(mode="ports", ports=["29500"]), "run-1", 4)
    batch = first.actions[0]
    assert batch.startswith("*filter\n:th-run-1 - [0:0]\n") and batch.endswith("COMMIT\n")
    assert "-A th-run-1 -s 10.0.0.2/32 -p tcp -m tcp --dport 29500 -m comment --comment" in batch
    assert "-I INPUT 1 -m comment --comment torchherd:run-1 -j th-run-1" in batch
    after = applied(DENY_S, first)
    again = ipt.iptables_plan(ipt.iptables_listing(after), spec(mode="ports", ports=["29500"]),
                              "run-1", 4)
    assert again.actions == [] and again.after == again.before
    teardown = ipt.iptables_plan(ipt.iptables_listing(after), None, "run-1", 4)
    assert applied(after, teardown) == DENY_S


def test_iptables_plan_for_ipv6_takes_the_ipv6_peers_only(spec):
    plan = ipt.iptables_plan(ipt.iptables_listing(DENY_S), spec(), "run-1", 6)
    assert [line.split()[4] for line in plan.after[1:]] == ["fd00::2/128"]
    assert plan.after[0].startswith("ip6tables -A INPUT")


def test_iptables_boot_restores_chain_and_jump(spec):
    text = ipt.iptables_boot(spec(), "run-1", 4)
    assert text.count("-A th-run-1 ") == 3 and "-I INPUT 1 " in text
    assert ipt.iptables_boot(None, "run-1", 4) is None
