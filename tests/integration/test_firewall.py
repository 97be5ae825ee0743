"""The firewall phase on a real container cluster (NET_ADMIN): each node has a default-deny
firewall of its own kind set up here as an administrator would (nftables, ufw, iptables,
firewalld where the image has it, and none), and every claim is checked with real TCP
connections from a job member and from a container outside the job, never with a tool's
status output.

The role runs through tests/integration/playbooks/firewall.yml with a plan made here; the
launches run through the driver with the launch's own firewall phase switched off, so that
the rules under test are the only ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ansible_runner
import pytest

from ansible_collections.torchherd.cluster.plugins.filter.plan import plan as make_plan
from driver import api, launch
from driver.paths import CHECKOUT, shipped_collections_path
from driver.runner import run_playbook
from tests.cluster import testbed
from tests.integration.helpers import EXAMPLES, REPO

pytestmark = pytest.mark.cluster

PLAYBOOK = REPO / "tests" / "integration" / "playbooks" / "firewall.yml"
MASTER_PORT = 29500
MODULE = "torchherd.cluster.firewall_rules"
ANSIBLE_ENV = {
    "ANSIBLE_CONFIG": str(CHECKOUT / "ansible.cfg"),
    "ANSIBLE_COLLECTIONS_PATH": str(shipped_collections_path()),
    # This interpreter's ansible-playbook, also when the venv is not activated.
    "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
}

LISTENER = """
import selectors, socket, sys
servers = selectors.DefaultSelector()
for port in sys.argv[1:]:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", int(port)))
    server.listen(64)
    servers.register(server, selectors.EVENT_READ)
while True:
    for key, _events in servers.select():
        key.fileobj.accept()[0].close()
"""
# Waits until every port given accepts a connection on loopback, which every firewall passes.
READY = """
import socket, sys, time
deadline = time.monotonic() + 10
for port in sys.argv[1:]:
    while True:
        try:
            socket.create_connection(("127.0.0.1", int(port)), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"nothing listens on port {port}")
            time.sleep(0.05)
"""
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
except OSError as exc:
    sys.exit(f"{type(exc).__name__}: {exc}")
"""

# An administrator's default deny on input: established traffic, loopback and SSH only.
NFT_DENY = """#!/usr/sbin/nft -f
flush ruleset
table inet admin {
  chain input {
    type filter hook input priority filter; policy drop;
    ct state established,related accept
    iif lo accept
    tcp dport 22 accept
  }
}
"""


def write_file(cluster, node, path, text):
    cluster.exec(node, ["python3", "-c", "import sys; open(sys.argv[1], 'w').write(sys.argv[2])",
                        path, text])


def deny_nftables(cluster, node):
    write_file(cluster, node, "/etc/nftables.conf", NFT_DENY)
    cluster.exec(node, ["nft", "-f", "/etc/nftables.conf"])


def deny_ufw(cluster, node):
    cluster.exec(node, ["ufw", "allow", "22/tcp"])
    cluster.exec(node, ["ufw", "--force", "enable"])  # default: deny incoming


def deny_iptables(cluster, node):
    for command in ("iptables", "ip6tables"):
        for rule in (["-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                      "-j", "ACCEPT"],
                     ["-A", "INPUT", "-i", "lo", "-j", "ACCEPT"],
                     ["-A", "INPUT", "-p", "tcp", "--dport", "22", "-j", "ACCEPT"],
                     ["-P", "INPUT", "DROP"]):
            cluster.exec(node, [command, *rule])


def deny_firewalld(cluster, node):
    # The default zone (public) rejects everything but ssh and dhcpv6-client.
    cluster.exec(node, ["systemctl", "start", "firewalld"])
    cluster.exec(node, ["firewall-cmd", "--state"])


DENY = {"nftables": deny_nftables, "ufw": deny_ufw, "iptables": deny_iptables,
        "firewalld": deny_firewalld, "none": lambda cluster, node: None}


def firewalled_cluster(make_cluster, name, kinds):
    """A cluster whose node i has a default-deny firewall of kind kinds[i], plus an outsider.

    firewalld runs only where the node image has it; its node then has no firewall."""
    cluster = make_cluster(name, len(kinds), extra=("outsider",))
    kinds = list(kinds)
    if "firewalld" in kinds:
        node = cluster.nodes[kinds.index("firewalld")]
        found = cluster.exec(node, ["sh", "-c", "command -v firewall-cmd"], check=False)
        if found.returncode != 0:
            warnings.warn("firewalld is not in the node image: its backend is not exercised",
                          stacklevel=2)
            kinds = ["none" if kind == "firewalld" else kind for kind in kinds]
    backends = dict(zip(cluster.nodes, kinds, strict=True))
    with ThreadPoolExecutor(len(backends)) as pool:
        list(pool.map(lambda item: DENY[item[1]](cluster, item[0]), backends.items()))
    return cluster, backends


def listen(cluster, nodes, *ports):
    """A listener on the ports of every node, ready when this returns."""
    def start(node):
        testbed.podman("exec", "--detach", node.name, "python3", "-c", LISTENER, *map(str, ports))
        cluster.exec(node, ["python3", "-c", READY, *map(str, ports)])

    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(start, nodes))


def stop_listeners(cluster, nodes):
    for node in nodes:
        cluster.exec(node, ["pkill", "-f", "servers.select"], check=False)


def connects(cluster, source, address, port, timeout=1.5):
    probe = cluster.exec(source, ["python3", "-c", CONNECT, address, str(port), str(timeout)],
                         check=False)
    return probe.returncode == 0


def reachable(cluster, probes):
    """{'src->dst:port': connected} for (source, target, port) probes, all at once."""
    def one(probe):
        source, target, port = probe
        return connects(cluster, source, cluster.node(target).ip, port)

    with ThreadPoolExecutor(len(probes)) as pool:
        results = list(pool.map(one, probes))
    return {label(*probe): ok for probe, ok in zip(probes, results, strict=True)}


def label(source, target, port):
    return f"{source.name.rsplit('-', 1)[-1]}->{target.name.rsplit('-', 1)[-1]}:{port}"


def job_plan(cluster, run_id, **job):
    """The plan of a job on the cluster's nodes, made by the plan filter; node0 is the master."""
    groups = {"torchherd_nodes": [n.name for n in cluster.nodes]}
    hostvars = {n.name: {"ansible_host": n.ip} for n in cluster.nodes}
    return make_plan(dict(job, script="train.py", master_port=MASTER_PORT), groups, hostvars,
                     run_id=run_id)


def run_role(cluster, plan, *, teardown=False, check=False):
    """Run the role (or its teardown) on the cluster's nodes; each node's module result."""
    results, failures = {}, []

    def collect(event):
        data = event.get("event_data") or {}
        if event["event"] == "runner_on_ok" and data.get("task_action") == MODULE:
            results[data["host"]] = data["res"]
        elif event["event"] in ("runner_on_failed", "runner_on_unreachable"):
            failures.append(f"{data.get('host')}: {data.get('task')}: {data['res'].get('msg')}")
        return False

    private = tempfile.mkdtemp(prefix="torchherd-fwtest-")
    try:
        outcome = ansible_runner.run(
            private_data_dir=private,
            playbook=str(PLAYBOOK),
            inventory=str(cluster.inventory),
            extravars={"torchherd_plan": plan, "torchherd_test_teardown": teardown},
            cmdline="--diff --check" if check else "--diff",
            envvars=ANSIBLE_ENV,
            quiet=True,
            event_handler=collect,
        )
        output = outcome.stdout.read()
    finally:
        shutil.rmtree(private, ignore_errors=True)
    assert outcome.status == "successful" and not failures, failures or output[-3000:]
    return {cluster.node(host): result for host, result in results.items()}


def leftovers(cluster, node):
    """Every trace of torchherd in the node's firewalls and files; empty when clean. (Rich
    rules carry no name: the nodes have none but torchherd's.)"""
    listing = cluster.exec(node, ["sh", "-c", (
        "nft list ruleset; iptables -S; ip6tables -S; ufw show added; firewall-cmd "
        "--list-rich-rules; ls -d /var/lib/torchherd /etc/torchherd /etc/systemd/system/torch*"
    )], check=False).stdout
    return [line for line in listing.splitlines()
            if "torchherd" in line or re.search(r"(^|\s)th-|^rule ", line)]


def launch_inventory(cluster, tmp_path):
    """The cluster's inventory with the launch's own firewall phase off: only the rules
    under test may open the nodes."""
    inventory = tmp_path / "inventory.ini"
    inventory.write_text(cluster.inventory.read_text()
                         + "\n[torchherd_nodes:vars]\ntorchherd_firewall_enabled=false\n")
    return inventory


def allreduce_job(**extra):
    # Bounded: a blocked connection fails the job in a minute instead of hanging.
    return {"script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 1,
            "args": ["--pg-timeout", "60"], "timeout": 120, **extra}


def test_job_nodes_reach_each_other_through_every_firewall_and_nobody_else(make_cluster, tmp_path):
    cluster, backends = firewalled_cluster(
        make_cluster, "fwmix", ["nftables", "ufw", "iptables", "firewalld"])
    outsider = cluster.node("outsider")
    nodes = cluster.nodes
    listen(cluster, nodes, MASTER_PORT)
    # Each node is probed from the next one (a job member) and from the outsider.
    probes = [(nodes[(i + 1) % len(nodes)], n, MASTER_PORT) for i, n in enumerate(nodes)]
    probes += [(outsider, n, MASTER_PORT) for n in nodes]
    unfiltered = {n for n, kind in backends.items() if kind == "none"}
    closed = {label(s, t, p): t in unfiltered for s, t, p in probes}
    member_open = {key: ok or not key.startswith("outsider") for key, ok in closed.items()}
    assert reachable(cluster, probes) == closed

    plan = job_plan(cluster, "fw-members-1")
    checked = run_role(cluster, plan, check=True)
    for node, kind in backends.items():
        assert checked[node]["changed"] is (kind != "none"), (node.name, checked[node])
        assert checked[node]["backends"] == ([] if kind == "none" else [kind])
        assert checked[node]["diff"]["before"] == ""
        assert bool(checked[node]["diff"]["after"]) is (kind != "none")
        if kind in ("nftables", "iptables", "ufw"):
            assert "torchherd:fw-members-1" in checked[node]["diff"]["after"]
    assert reachable(cluster, probes) == closed, "check mode changed a firewall"

    applied = run_role(cluster, plan)
    for node, kind in backends.items():
        assert applied[node]["changed"] is (kind != "none"), (node.name, applied[node])
        assert applied[node]["rules"] == checked[node]["rules"]
        if kind == "none":
            assert "no firewall is active" in applied[node]["msg"]
    assert reachable(cluster, probes) == member_open

    again = run_role(cluster, plan)
    assert {n.name: r["changed"] for n, r in again.items()} == {n.name: False for n in nodes}
    assert {n: r["rules"] for n, r in again.items()} == {n: r["rules"] for n, r in applied.items()}

    # Members mode opens every port: the launch takes another master port than the listeners'.
    job = allreduce_job(master_port=MASTER_PORT + 10)
    result = launch(job, launch_inventory(cluster, tmp_path), runs_dir=tmp_path)
    assert result.ok, result.reason
    assert result.summary["world_size"] == len(nodes)
    assert reachable(cluster, probes) == member_open

    torn = run_role(cluster, plan, teardown=True)
    for node, kind in backends.items():
        assert torn[node]["changed"] is (kind != "none"), (node.name, torn[node])
        assert torn[node]["diff"]["after"] == ""
        assert leftovers(cluster, node) == [], node.name
    assert reachable(cluster, probes) == closed


def test_two_runs_on_the_same_nodes_keep_their_own_rules(make_cluster):
    # Identical rules for both runs: the hard case for ufw and firewalld, which keep one rule.
    cluster, backends = firewalled_cluster(
        make_cluster, "fwshare", ["nftables", "ufw", "iptables", "firewalld"])
    filtered = [n for n, kind in backends.items() if kind != "none"]
    listen(cluster, cluster.nodes, MASTER_PORT)
    probes = [(cluster.nodes[(i + 1) % len(cluster.nodes)], n, MASTER_PORT)
              for i, n in enumerate(cluster.nodes)]
    first, second = job_plan(cluster, "fw-share-1"), job_plan(cluster, "fw-share-2")
    run_role(cluster, first)
    added = run_role(cluster, second)
    assert {n.name: added[n]["changed"] for n in filtered} == {n.name: True for n in filtered}

    removed = run_role(cluster, first, teardown=True)
    assert {n.name: removed[n]["changed"] for n in filtered} == {n.name: True for n in filtered}
    still = reachable(cluster, probes)
    assert all(still.values()), f"tearing down run 1 closed run 2's ports: {still}"
    kept = run_role(cluster, second)
    touched = {n.name: r["diff"] for n, r in kept.items() if r["changed"]}
    assert touched == {}, "run 2's rules were touched"

    run_role(cluster, second, teardown=True)
    closed = {label(s, t, p): backends[t] == "none" for s, t, p in probes}
    assert reachable(cluster, probes) == closed
    for node in cluster.nodes:
        assert leftovers(cluster, node) == [], node.name


def test_ports_mode_opens_only_the_listed_ports_and_a_pinned_launch_passes(make_cluster, tmp_path):
    # nftables takes ports mode in the reboot test below.
    cluster, _backends = firewalled_cluster(make_cluster, "fwports", ["ufw", "iptables"])
    master, other = cluster.nodes[0], cluster.nodes[1]
    outsider = cluster.node("outsider")
    pinned, stray = 45000, 29600
    # What the docs tell users: the kernel gives gloo's and NCCL's listening sockets ports from
    # the pinned range on every node (set from the host: /proc/sys is read-only in containers).
    for node in cluster.nodes:
        pid = testbed.podman("inspect", "--format", "{{.State.Pid}}", node.name).stdout.strip()
        testbed.run(["nsenter", "-t", pid, "-n", "sysctl", "-w",
                     f"net.ipv4.ip_local_port_range={pinned} {pinned + 999}"])
    listen(cluster, cluster.nodes, MASTER_PORT, pinned, stray)
    plan = job_plan(cluster, "fw-ports-1", firewall_mode="ports",
                    firewall_ports=[f"{pinned}-{pinned + 999}"])
    run_role(cluster, plan)

    assert reachable(cluster, [
        (other, master, MASTER_PORT), (other, master, pinned), (master, other, pinned),
        (other, master, stray), (master, other, MASTER_PORT), (outsider, master, MASTER_PORT),
        (outsider, other, pinned),
    ]) == {
        "node1->node0:29500": True, "node1->node0:45000": True, "node0->node1:45000": True,
        # Not listed; the master port is open on the master only; the outsider nowhere.
        "node1->node0:29600": False, "node0->node1:29500": False,
        "outsider->node0:29500": False, "outsider->node1:45000": False,
    }

    stop_listeners(cluster, cluster.nodes)  # the launch needs the master port
    result = launch(allreduce_job(), launch_inventory(cluster, tmp_path), runs_dir=tmp_path)
    assert result.ok, result.reason

    run_role(cluster, plan, teardown=True)
    listen(cluster, cluster.nodes, MASTER_PORT, pinned)
    for node in cluster.nodes:
        assert leftovers(cluster, node) == [], node.name
    closed = reachable(cluster, [(other, master, MASTER_PORT), (master, other, pinned)])
    assert not any(closed.values()), closed


class FirewallSteps:
    """From a launch's events, per host: the rules its start opened, what its last wait
    removed, and which firewall_rules tasks (the role's own opening and teardown) ran."""

    def __init__(self):
        self.opened, self.closed, self.role_tasks = {}, {}, []
        self.with_facts = False

    def __call__(self, event):
        data = event.get("event_data") or {}
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        # A wait that sees its job fail fails its task on purpose (the gang stop's rescue).
        if event.get("event") not in ("runner_on_ok", "runner_on_failed"):
            return
        if data.get("task_action") == MODULE:
            self.role_tasks.append(f"{data.get('host')}: {data.get('task')}")
        elif data.get("task_action") == "torchherd.cluster.torchrun_job" and "firewall" in res:
            steps = self.opened if res.get("started") is not None else self.closed
            steps[data["host"]] = res["firewall"]
        elif data.get("task_action") == "torchherd.cluster.node_facts" \
                and "firewall" in (res.get("start") or {}):
            # A relaunch's start that came with the facts call (start.with_facts).
            self.opened[data["host"]] = res["start"]["firewall"]
            self.with_facts = True


def test_a_launch_as_root_opens_the_firewalls_in_its_start_and_leaves_none(make_cluster, tmp_path):
    # The launch's own firewall phase, as root: the start opens each node's rules before its
    # barrier (the job's rendezvous and gloo get through default-deny only then), and the
    # node's supervisor removes them as the job ends there, after success and after a gang
    # stop alike; the firewall role's own tasks (a round trip each) do not run, nor a teardown.
    cluster, backends = firewalled_cluster(make_cluster, "fwlaunch",
                                           ["nftables", "iptables", "ufw"])
    hosts = sorted(node.name for node in cluster.nodes)
    # The same job twice: the relaunch's starts come with its facts calls (start.with_facts),
    # and open the rules there.
    for i, args in enumerate(([], [], ["--fail-rank", "1", "--fail-after", "2"])):
        steps = FirewallSteps()
        result = launch(allreduce_job(args=["--pg-timeout", "60", *args]), cluster.inventory,
                        runs_dir=tmp_path, on_event=steps)
        if args:
            assert not result.ok
            assert result.hosts[cluster.nodes[1].name]["failing_rank"] == 1, result.reason
        else:
            assert result.ok, result.reason
            assert [h["state"] for h in result.hosts.values()] == ["succeeded"] * len(backends)
        schedule = json.loads((Path(result.run_dir) / "schedule.json").read_text())
        assert steps.with_facts == schedule["start"]["with_facts"] == (i == 1), i
        assert sorted(steps.opened) == hosts and all(f["rules"] for f in steps.opened.values())
        # Each node's supervisor removed its rules as its job ended (its run-state record,
        # collected); the watch waited on the master alone, whose wait found them removed.
        records = {host: json.loads((Path(result.run_dir) / "nodes" / host / "run.json")
                                    .read_text())["firewall"] for host in hosts}
        assert all(f["opened_by"] == "start" and f["rules"] and f["closed_by"] == "supervisor"
                   and f["error"] is None and f["changed"] for f in records.values()), records
        assert list(steps.closed) == [cluster.nodes[0].name], steps.closed
        assert steps.closed[cluster.nodes[0].name] == {"changed": False,
                                                       "closed_by": "supervisor"}
        assert steps.role_tasks == []
        for node in cluster.nodes:
            assert leftovers(cluster, node) == [], node.name
    # The default deny is back: the job's nodes cannot reach each other's master port.
    listen(cluster, cluster.nodes[:1], MASTER_PORT)
    assert reachable(cluster, [(cluster.nodes[1], cluster.nodes[0], MASTER_PORT)]) == {
        "node1->node0:29500": False}


def test_rules_the_firewall_role_opened_are_torn_down_after_the_job(make_cluster, tmp_path):
    # The role path (a job that does not run as root opens its rules with become; forced here
    # by an extra var, as the nodes log in as root): the start opens nothing, so the last wait
    # removes nothing, and the teardown play must run on exactly the nodes that hold rules.
    cluster, backends = firewalled_cluster(make_cluster, "fwrole", ["nftables", "iptables"])
    hosts = sorted(node.name for node in cluster.nodes)
    steps = FirewallSteps()
    job = api._prepare(allreduce_job(), tmp_path, str(cluster.inventory), "launch")
    outcome = run_playbook("launch", cluster.inventory,
                           {"torchherd_job": job, "torchherd_torchrun_firewall": False},
                           on_event=steps)
    assert outcome.status == "successful", outcome.failures
    assert steps.opened == {} and steps.closed == {}
    assert sorted(steps.role_tasks) == sorted(
        [f"{h}: Allow the job's traffic from its other nodes, and from nowhere else"
         for h in hosts] + [f"{h}: Remove the job's firewall rules" for h in hosts])
    for node in cluster.nodes:
        assert leftovers(cluster, node) == [], node.name


def reboot(cluster, node):
    """Power the node off and on (podman kill + start): the kernel's rules are gone, systemd
    boots again and loads what is meant to persist."""
    testbed.podman("kill", node.name)
    testbed.podman("wait", node.name)
    testbed.podman("start", node.name)
    cluster.wait_ssh()


def test_only_persistent_rules_survive_a_reboot(make_cluster):
    cluster, _backends = firewalled_cluster(make_cluster, "fwboot", ["nftables", "none"])
    node, member = cluster.nodes
    cluster.exec(node, ["systemctl", "enable", "nftables"])  # the admin's deny comes back at boot
    kept, lost = MASTER_PORT, MASTER_PORT + 1
    persistent = job_plan(cluster, "fw-boot-1", firewall_mode="ports", firewall_ports=[str(kept)],
                          firewall_persistent=True)
    runtime = job_plan(cluster, "fw-boot-2", firewall_mode="ports", firewall_ports=[str(lost)])
    run_role(cluster, persistent)
    applied = run_role(cluster, runtime)
    # The member has no firewall: nothing changes there, and the result says so.
    assert applied[member]["changed"] is False and applied[member]["backends"] == []
    assert "no firewall is active" in applied[member]["msg"]

    reboot(cluster, node)
    listen(cluster, [node], kept, lost)
    assert reachable(cluster, [(member, node, kept), (member, node, lost)]) == {
        "node1->node0:29500": True, "node1->node0:29501": False}

    torn = run_role(cluster, persistent, teardown=True)
    assert torn[node]["changed"] and torn[member]["changed"] is False
    gone = run_role(cluster, runtime, teardown=True)  # gone with the reboot: nothing to do
    assert [r["changed"] for r in gone.values()] == [False, False]
    reboot(cluster, node)
    listen(cluster, [node], kept)
    assert not connects(cluster, member, node.ip, kept)
    assert leftovers(cluster, node) == []
