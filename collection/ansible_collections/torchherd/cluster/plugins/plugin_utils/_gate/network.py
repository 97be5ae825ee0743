# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The network between the nodes: every node reaches the master and back, the interface each
node's job traffic uses, and the firewall rules a node lacks where the user may not add them."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.plugin_utils._answers import answer
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import problem


def _named(plan, host):
    """The interface the user named for host in the plan."""
    for node in plan.get("nodes") or []:
        if node.get("host") == host:
            return node.get("interface") or "?"
    return "?"


def _probe(hostvars, host):
    """The probe alone (verify), or the start barrier's own probe (launch)."""
    return (hostvars.get(host, {}).get("torchherd_probe")
            or answer(hostvars.get(host, {}), "torchherd_start").get("probe") or {})


def reachable(facts, hostvars, plan):
    """Every node reaches the master's port, and the master reaches every node back."""
    master = plan["master"]["host"]
    addr, port = plan["master"]["addr"], plan["master"]["port"]
    problems = []
    for host in facts:
        probe = _probe(hostvars, host)
        iface = (facts[host].get("interface") or {})
        if probe.get("reachable") and probe.get("back_error"):
            address = probe.get("address") or "?"
            seen = (_probe(hostvars, master).get("back_failed") or {}).get(address)
            on = f" (its interface {iface['name']})" if iface.get("name") else ""
            problems.append(problem(
                f"{master} -> {host}", "reachable from the master",
                f"a TCP connection from {master} to {host} at {address}{on}, as the job's "
                f"peers open them (gloo and NCCL listen on every node)",
                f"{seen} ({probe['back_error']})" if seen else probe["back_error"],
                f"let the job's other nodes into {host} on any TCP port (the firewall role does "
                f"it for the run where it may, firewall: true; mode ports needs the ports gloo "
                f"and NCCL are pinned to), or name an interface of {host} that the others reach "
                f"(torchherd_socket_ifname)"))
            continue
        if probe.get("skipped") or not probe or probe.get("reachable"):
            continue
        via = f" from its interface {iface['name']} ({iface['address']})" \
            if iface.get("name") and iface.get("address") else ""
        problems.append(problem(
            f"{host} -> {master}", "master reachable",
            f"a TCP connection from {host}{via} to {addr}:{port}",
            probe.get("error") or probe.get("msg") or "no answer",
            f"open port {port} on {master} to {host} (the job's firewall role does it, or "
            f"e.g. nft add rule inet filter input ip saddr <{host}'s address> tcp dport {port} "
            f"accept), check the route between them both ways, or set master_addr / the "
            f"master's torchherd_address to an address every node reaches"
            + (f"; the job's traffic leaves {host} on {iface['name']} "
               f"({'named by you' if iface.get('how') == 'explicit' else 'its route to ' + addr}):"
               f" name one that reaches the master with torchherd_socket_ifname or "
               f"socket_ifname" if via else "")))
    # The barrier's all-pairs proof, on the master: every pair of nodes that could not connect
    # on the job's interfaces, each already a problem of this template (module_utils/_probe).
    problems += list(_probe(hostvars, master).get("pairs_failed") or [])
    return problems


def chosen_interfaces(facts):
    """{host: the interface its job traffic uses} of the nodes that have one."""
    interfaces = {}
    for host, f in facts.items():
        iface = f.get("interface") or {}
        if iface.get("name") and not iface.get("error"):
            interfaces[host] = {k: iface.get(k) for k in ("name", "address", "how")}
    return interfaces


def missing_interfaces(facts, plan):
    """The problems of the nodes without an interface for the job's traffic."""
    addr = plan["master"]["addr"]
    problems = []
    for host, f in facts.items():
        iface = f.get("interface") or {}
        if iface.get("error"):
            named = iface.get("how") == "explicit"
            problems.append(problem(
                host, "interface",
                f"interface {iface.get('name') or _named(plan, host)} with an address to reach "
                f"{addr} from" if named else f"an interface whose route reaches {addr}",
                iface["error"],
                "name an interface of this node that reaches the master (torchherd_socket_ifname "
                "for the node, socket_ifname for the job; ip -br addr lists them)" if named else
                f"give the node a route to {addr} (the master address), or set master_addr / "
                f"the master's torchherd_address to an address every node reaches"))
    return problems


def firewall_without_root(hosts, hostvars, plan):
    """Where a path did not open and the user could not change a node's firewall (no root, no
    sudo), the rules that node lacks, for whoever may add them."""
    problems = []
    for host in hosts:
        firewall = hostvars.get(host, {}).get("torchherd_firewall") or {}
        if not (isinstance(firewall, dict) and firewall.get("no_privilege")):
            continue
        node = next((n for n in plan.get("nodes") or [] if n.get("host") == host), {})
        rules = node.get("firewall") or {}
        peers = " ".join(rules.get("peers") or []) or "-"
        ports = "any TCP port" if rules.get("mode") != "ports" else \
            "TCP ports " + ", ".join(rules.get("ports") or [])
        dport = "" if rules.get("mode") != "ports" else \
            " tcp dport { " + ", ".join(rules.get("ports") or []) + " }"
        problems.append(problem(
            host, "firewall (no root)",
            f"the job's rules opened there: {ports} from {peers}",
            f"the user may not change the firewall ({firewall.get('msg') or 'no root'})",
            f"ask an administrator to let the job's nodes in (e.g. nft insert rule inet filter "
            f"input ip saddr {{ {peers.replace(' ', ', ')} }}{dport} accept), give the user "
            f"passwordless sudo there (become), or launch as a user who may"))
    return problems


def checks(run):
    """Every path open, every node with an interface, and where a path did not open, the rules
    its nodes lack."""
    unreachable = reachable(run.facts, run.hostvars, run.plan)
    return (unreachable + missing_interfaces(run.facts, run.plan)
            + (firewall_without_root(run.hosts, run.hostvars, run.plan) if unreachable else []))


CHECKS = (checks,)
