"""Clusters as real ones are: a management network that carries SSH only and a data network for
the job, with interface names that differ between nodes; nodes with other process counts and
Python paths; a user without root. Real SSH, real gloo traffic, real nftables."""

from __future__ import annotations

import json
import re

import pytest

from driver import launch
from driver.api import Exit
from tests.integration.helpers import EXAMPLES, assert_no_job_left

pytestmark = pytest.mark.cluster

OK_LINE = re.compile(r"torchherd-allreduce ok host=\S+ node_rank=(\d+) local_rank=(\d+) "
                     r"rank=(\d+) sum=(\S+) expected=(\S+)")


def job(run_id, **extra):
    return {"script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 1,
            "run_id": run_id, **extra}


def ranks(runs, run_id, cluster):
    """(node_rank, local_rank, rank, sum, expected) of every rank that printed its ok line."""
    found = []
    for node in cluster.nodes:
        log = (runs / run_id / "nodes" / node.name / "node.log").read_text()
        found += [tuple(m.groups()) for m in OK_LINE.finditer(log)]
    return sorted(found, key=lambda f: int(f[2]))


def _python_at(cluster, node, path):
    """A job Python at another path: a venv on the node that sees the system's torch."""
    cluster.exec(node, ["python3", "-m", "venv", "--system-site-packages", "--without-pip", path])
    return f"{path}/bin/python"


@pytest.fixture(scope="module")
def mixed(uneven, tmp_path_factory):
    """One launch of the plain job that three tests below read, each for its own part: the
    interface each node chose by itself, one, two and three processes on the nodes, and node1's
    job Python at another path. The same job on the same nodes, launched once where it was
    launched three times. Returns (result, runs directory, node1's job Python)."""
    runs = tmp_path_factory.mktemp("mixed")
    other = _python_at(uneven, 1, "/opt/elsewhere")
    host_vars = {node.name: {"torchherd_nproc_per_node": str(i + 1)}
                 for i, node in enumerate(uneven.nodes)}
    host_vars[uneven.nodes[1].name]["torchherd_python"] = other
    result = launch(job("mixed"), uneven.write_inventory(host_vars=host_vars), runs_dir=runs)
    # Nothing of it is left on the nodes: the cluster's other tests run after it.
    assert_no_job_left(uneven)
    return result, runs, other


def test_interfaces_are_chosen_per_node_and_proved(uneven, mixed):
    """Every node's data interface has another name; the management network drops all but
    SSH, so a job on the wrong interface could not run."""
    result, runs, _ = mixed
    assert result.ok, result.reason
    found = ranks(runs, "mixed", uneven)
    assert [int(f[2]) for f in found] == list(range(6)) and {f[3] for f in found} == {"15"}
    summary = json.loads((runs / "mixed" / "summary.json").read_text())
    preflight = json.loads((runs / "mixed" / "preflight.json").read_text())
    for node in uneven.nodes:
        chosen = summary["hosts"][node.name]["interface"]
        assert chosen["name"] == node.data_if and chosen["address"] == node.data_ip, chosen
        assert preflight["gate"]["interfaces"][node.name]["name"] == node.data_if
        env = json.loads((runs / "mixed" / "nodes" / node.name / "env.json").read_text())
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == node.data_if
    assert summary["hosts"][uneven.nodes[0].name]["interface"]["how"] == "local"
    assert summary["hosts"][uneven.nodes[1].name]["interface"]["how"] == "route"
    assert len({n.data_if for n in uneven.nodes}) == 3


def test_the_management_interface_forced_fails_before_any_start(uneven, tmp_path):
    names = {node.name: {"torchherd_socket_ifname": node.mgmt_if} for node in uneven.nodes}
    inventory = uneven.write_inventory(host_vars=names)
    result = launch(job("if-mgmt", probe_window=4, probe_timeout=2), inventory,
                    runs_dir=tmp_path)
    assert not result.ok and result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
    master = uneven.nodes[0].name
    for node in uneven.nodes[1:]:
        # The path that is blocked, named: here the master's connections to the node's
        # management address (new connections there are dropped; SSH only).
        named = [p for p in result.problems if node.name in p["host"]
                 and p["check"] in ("master reachable", "reachable from the master")]
        assert named, result.problems
        assert named[0]["host"] in (f"{node.name} -> {master}", f"{master} -> {node.name}")
        assert node.ip in named[0]["expected"] and node.mgmt_if in named[0]["expected"]
    for node in uneven.nodes:
        # No launcher ever ran: the barrier called the start off on every node.
        started = uneven.exec(node, ["test", "-e", "/root/.torchherd/runs/if-mgmt/pid"],
                              check=False)
        assert started.returncode != 0, f"{node.name} started the job"
    assert_no_job_left(uneven)


def test_a_named_interface_missing_on_a_node_is_refused(uneven, tmp_path):
    inventory = uneven.write_inventory(
        host_vars={uneven.nodes[1].name: {"torchherd_socket_ifname": "ib7"}})
    result = launch(job("if-missing"), inventory, runs_dir=tmp_path)
    assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
    problem = next(p for p in result.problems if p["check"] == "interface")
    assert problem["host"] == uneven.nodes[1].name
    assert "no interface ib7" in problem["found"] and uneven.nodes[1].data_if in problem["found"]


def test_nodes_with_one_two_and_three_processes(uneven, mixed):
    result, runs, _ = mixed
    assert result.ok, result.reason
    found = ranks(runs, "mixed", uneven)
    # Global ranks follow node order: node0 has rank 0, node1 ranks 1-2, node2 ranks 3-5.
    assert [(int(f[0]), int(f[1]), int(f[2])) for f in found] == [
        (0, 0, 0), (1, 0, 1), (1, 1, 2), (2, 0, 3), (2, 1, 4), (2, 2, 5)]
    assert {(f[3], f[4]) for f in found} == {("15", "15")}
    summary = json.loads((runs / "mixed" / "summary.json").read_text())
    assert summary["world_size"] == 6
    assert [summary["hosts"][n.name]["nproc_per_node"] for n in uneven.nodes] == [1, 2, 3]


# Writes a stand-in torch 2.12.0 into the venv running it: what the probe reads of a torch.
FAKE_TORCH = """
import os, site
top = os.path.join(site.getsitepackages()[0], "torch")
files = {
    "__init__.py": "__version__ = '2.12.0+cpu'\\nfrom . import version, cuda, distributed\\n",
    "version.py": "cuda = None\\n",
    "cuda/__init__.py": "def is_available():\\n    return False\\n",
    "distributed/__init__.py": "def is_available():\\n    return True\\n"
                               "def is_nccl_available():\\n    return False\\n"
                               "def is_gloo_available():\\n    return True\\n",
}
for name, text in files.items():
    os.makedirs(os.path.dirname(os.path.join(top, name)), exist_ok=True)
    with open(os.path.join(top, name), "w") as out:
        out.write(text)
"""


def test_a_node_with_its_python_elsewhere_and_one_with_another_torch(uneven, mixed, tmp_path):
    result, runs, other = mixed
    assert result.ok, result.reason
    cmd = json.loads((runs / "mixed" / "nodes" / uneven.nodes[1].name / "cmd.json").read_text())
    assert cmd[0] == other
    # Another torch on node2: a package of that name first on the job Python's path.
    fake = _python_at(uneven, 2, "/opt/oldtorch")
    uneven.exec(2, [fake, "-c", FAKE_TORCH])
    inventory = uneven.write_inventory(
        host_vars={uneven.nodes[1].name: {"torchherd_python": other},
                   uneven.nodes[2].name: {"torchherd_python": fake}})
    result = launch(job("py-torch"), inventory, runs_dir=tmp_path)
    assert result.exit_code == Exit.PREFLIGHT_FAILED
    checks = {(p["host"], p["check"]) for p in result.problems}
    assert (uneven.nodes[2].name, "same torch.version") in checks, result.problems
    assert not any(c == "same python.minor" for _h, c in checks)
    assert_no_job_left(uneven)


DENY = """table inet testdeny {
  chain input {
    type filter hook input priority 0; policy drop;
    iifname "lo" accept
    ct state established,related accept
    tcp dport 22 accept
  }
}
"""


@pytest.fixture
def trainer(uneven):
    """An inventory that logs in as a user without root or sudo on every node."""
    for node in uneven.nodes:
        uneven.exec(node, ["sh", "-c", "id trainer >/dev/null 2>&1 || useradd -m trainer"])
    return uneven.write_inventory(
        host_vars={node.name: {"ansible_user": "trainer"} for node in uneven.nodes})


def test_a_user_without_root_launches_where_no_firewall_needs_opening(uneven, trainer,
                                                                        tmp_path):
    result = launch(job("nonroot"), trainer, runs_dir=tmp_path)
    assert result.ok, result.reason
    assert {f[3] for f in ranks(tmp_path, "nonroot", uneven)} == {"3"}
    preflight = json.loads((tmp_path / "nonroot" / "preflight.json").read_text())
    assert 0 not in {facts["euid"] for facts in preflight["facts"].values()}
    assert_no_job_left(uneven)


def test_a_user_without_root_stops_a_detached_job_with_nothing_left(uneven, trainer,
                                                                     tmp_path):
    """stop removes the run's firewall rules with become; a user who may not has put none
    there, and the stop must not fail on it."""
    from driver import status, stop

    result = launch(job("nonroot-stop", args=["--sleep", "600"], detach=True), trainer,
                    runs_dir=tmp_path)
    assert result.state == "running", result.reason
    assert status("nonroot-stop", runs_dir=tmp_path).state == "running"
    stopped = stop("nonroot-stop", runs_dir=tmp_path)
    assert stopped.state == "stopped", stopped.reason
    assert_no_job_left(uneven)


def test_become_another_user_runs_the_job_as_that_user(uneven, trainer, tmp_path):
    """-b --become-user, as ansible-playbook takes them: root logs in, the job runs as the
    user become names (its euid in the facts, its home's torchherd root), and stop leaves
    nothing."""
    import subprocess
    import sys

    from tests.integration.helpers import REPO

    done = subprocess.run(
        [sys.executable, "-m", "driver", "launch", "-i", str(uneven.inventory), "-b",
         "--become-user", "trainer", "--code-src", str(EXAMPLES), "--nproc-per-node", "1",
         "--run-id", "become", "--runs-dir", str(tmp_path), "--json", "--", "allreduce.py"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    result = json.loads(done.stdout)
    assert done.returncode == 0, (result.get("reason"), done.stderr[-2000:])
    assert {f[3] for f in ranks(tmp_path, "become", uneven)} == {"3"}
    facts = json.loads((tmp_path / "become" / "preflight.json").read_text())["facts"]
    uids = {node.name: uneven.exec(node, ["id", "-u", "trainer"]).stdout.strip()
            for node in uneven.nodes}
    assert {h: str(f["euid"]) for h, f in facts.items()} == uids
    assert all(f["root"].startswith("/home/trainer/") for f in facts.values()), facts
    assert_no_job_left(uneven)


def test_a_user_without_root_is_told_what_a_default_deny_node_lacks(uneven, trainer,
                                                                      tmp_path):
    denied = uneven.nodes[1]
    uneven.exec(denied, ["sh", "-c", f"printf '%s' '{DENY}' | nft -f -"])
    try:
        result = launch(job("nonroot-deny", probe_window=4, probe_timeout=2), trainer,
                        runs_dir=tmp_path)
    finally:
        uneven.exec(denied, ["nft", "delete", "table", "inet", "testdeny"], check=False)
    assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
    checks = {(p["host"], p["check"]): p for p in result.problems}
    master = uneven.nodes[0].name
    assert (f"{master} -> {denied.name}", "reachable from the master") in checks, \
        result.problems
    lacks = checks[(denied.name, "firewall (no root)")]
    assert denied.data_ip not in lacks["expected"]  # its peers' addresses, not its own
    for peer in (uneven.nodes[0], uneven.nodes[2]):
        assert peer.data_ip in lacks["expected"], lacks
    assert "administrator" in lacks["fix"]
    assert_no_job_left(uneven)


def _interconnect(runs, run_id):
    return json.loads((runs / run_id / "preflight.json").read_text())["gate"]["interconnect"]


def test_the_interconnect_measure_is_reused_only_over_the_same_interfaces(uneven, tmp_path):
    """Within its age the measure of these nodes is reused while the job's traffic takes the
    same interfaces; named onto other ones (here the management network, opened to the job for
    this test), the nodes are measured again, over those."""
    from driver import verify

    for run_id in ("ic-data", "ic-data-again"):
        result = verify(job(run_id, interconnect="verify"), uneven.inventory, runs_dir=tmp_path)
        assert result.ok, result.reason
    assert _interconnect(tmp_path, "ic-data")["reused"] is None
    assert _interconnect(tmp_path, "ic-data-again")["reused"]["run_id"] == "ic-data"
    # The job moved to the management network: its interface, and the address the other nodes
    # reach each node at.
    names = {node.name: {"torchherd_socket_ifname": node.mgmt_if, "torchherd_address": node.ip}
             for node in uneven.nodes}
    inventory = uneven.write_inventory(host_vars=names)
    try:
        for node in uneven.nodes:
            uneven.open_management(node)
        result = verify(job("ic-mgmt", interconnect="verify"), inventory, runs_dir=tmp_path)
    finally:
        for node in uneven.nodes:
            uneven.close_management(node)
    assert result.ok, result.reason
    measured = _interconnect(tmp_path, "ic-mgmt")
    assert measured["reused"] is None and measured["ok"], measured
    gate = json.loads((tmp_path / "ic-mgmt" / "preflight.json").read_text())["gate"]
    assert {host: i["name"] for host, i in gate["interfaces"].items()} == {
        node.name: node.mgmt_if for node in uneven.nodes}
    assert_no_job_left(uneven)
