"""Preflight on the container cluster: every check stops the launch before torchrun starts."""

from __future__ import annotations

import json

import pytest

from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.nccl import host_identity
from driver import launch, verify
from driver.api import Exit
from tests.integration.helpers import EXAMPLES, JOB_PROCS

pytestmark = pytest.mark.cluster


FAKE_TORCH = {
    "torch/__init__.py": (
        "__version__ = '2.12.1+cpu'\n"
        "class version:\n    cuda = None\n"
        "class cuda:\n"
        "    is_available = staticmethod(lambda: False)\n"
        "    device_count = staticmethod(lambda: 0)\n"
        "from . import distributed\n"),
    "torch/distributed/__init__.py": (
        "def is_available(): return True\n"
        "def is_nccl_available(): return False\n"
        "def is_gloo_available(): return True\n"),
}


def job(run_id, **extra):
    return {"script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 1,
            "run_id": run_id, **extra}


def with_interpreter(cluster, tmp_path, node, python):
    """A copy of the cluster's inventory where one node's Python is another one."""
    text = cluster.inventory.read_text()
    name = cluster.node(node).name
    lines = [f"{line} ansible_python_interpreter={python}"
             if line.startswith(f"{name} ") else line for line in text.splitlines()]
    path = tmp_path / "inventory.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def problems(runs, run_id):
    return json.loads((runs / run_id / "preflight.json").read_text())["gate"]["problems"]


def assert_nothing_started(cluster, run_id):
    for node in cluster.nodes:
        assert cluster.pids(node, JOB_PROCS) == [], f"a job process runs on {node.name}"
        ran = cluster.exec(node, ["test", "-e", f"/root/.torchherd/runs/{run_id}"], check=False)
        assert ran.returncode != 0, f"run {run_id} started on {node.name}"


def test_node_without_torch(cluster3, tmp_path):
    cluster3.exec(1, ["python3", "-m", "venv", "--without-pip", "/opt/notorch"])
    inventory = with_interpreter(cluster3, tmp_path, 1, "/opt/notorch/bin/python")
    result = launch(job("no-torch"), inventory, runs_dir=tmp_path)
    assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
    found = problems(tmp_path, "no-torch")
    assert [(p["host"], p["check"]) for p in found] == [("it3-node1", "torch")]
    assert "ModuleNotFoundError" in found[0]["found"]
    assert "/opt/notorch/bin/python" in found[0]["fix"]
    assert_nothing_started(cluster3, "no-torch")


def test_node_with_other_versions(cluster3, tmp_path):
    cluster3.exec(2, ["python3", "-m", "venv", "--without-pip", "/opt/oldtorch"])
    site = cluster3.exec(2, ["/opt/oldtorch/bin/python", "-c",
                             "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    for rel, text in FAKE_TORCH.items():
        path = f"{site.stdout.strip()}/{rel}"
        cluster3.exec(2, ["mkdir", "-p", path.rsplit("/", 1)[0]])
        cluster3.exec(2, ["python3", "-c", f"open({path!r}, 'w').write({text!r})"])
    inventory = with_interpreter(cluster3, tmp_path, 2, "/opt/oldtorch/bin/python")
    result = verify(job("old-torch"), inventory, runs_dir=tmp_path)
    assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
    found = problems(tmp_path, "old-torch")
    versions = [p for p in found if p["check"] == "same torch.version"]
    assert versions and versions[0]["host"] == "it3-node2"
    assert versions[0]["found"] == "2.12.1+cpu"
    assert versions[0]["expected"].startswith("2.13.0") and "it3-node0" in versions[0]["expected"]
    assert_nothing_started(cluster3, "old-torch")


def test_master_port_in_use(cluster3, tmp_path):
    server = ["python3", "-c", "import socket,time; s=socket.socket(); "
              "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
              "s.bind(('0.0.0.0', 29511)); s.listen(); time.sleep(120)"]
    cluster3.exec(0, ["systemd-run", "--unit=busyport", *server])
    try:
        cluster3.exec(0, ["sh", "-c", "for i in $(seq 50); do ss -ltn | grep -q :29511 && "
                                      "exit 0; sleep 0.1; done; exit 1"])
        result = launch(job("port-busy", master_port=29511), cluster3.inventory,
                        runs_dir=tmp_path)
    finally:
        cluster3.exec(0, ["systemctl", "stop", "busyport"], check=False)
    assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
    found = problems(tmp_path, "port-busy")
    assert [(p["host"], p["check"]) for p in found] == [("it3-node0", "master port")]
    assert "29511" in found[0]["expected"]
    assert_nothing_started(cluster3, "port-busy")


def test_master_port_dropped_by_firewall(cluster3, tmp_path):
    cluster3.exec(0, ["nft", "add", "table", "inet", "thtest"])
    cluster3.exec(0, ["nft", "add", "chain", "inet", "thtest", "input",
                      "{ type filter hook input priority 0; policy accept; }"])
    cluster3.exec(0, ["nft", "add", "rule", "inet", "thtest", "input", "tcp", "dport", "29512",
                      "drop"])
    try:
        # With the job's own firewall phase off, the admin's drop rule is what the job meets.
        result = launch(job("port-dropped", master_port=29512, firewall=False),
                        cluster3.inventory, runs_dir=tmp_path)
    finally:
        cluster3.exec(0, ["nft", "delete", "table", "inet", "thtest"], check=False)
    assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
    found = problems(tmp_path, "port-dropped")
    pairs = {p["host"] for p in found if p["check"] == "master reachable"}
    assert {"it3-node1 -> it3-node0", "it3-node2 -> it3-node0"} <= pairs
    assert all("timed out" in p["found"] for p in found if p["check"] == "master reachable")
    assert "29512" in result.reason
    assert_nothing_started(cluster3, "port-dropped")
    # The probe listener is gone: the port is free again.
    assert "29512" not in cluster3.exec(0, ["ss", "-ltn"]).stdout


def test_nccl_with_more_processes_than_gpus(cluster3, tmp_path):
    result = verify(job("no-gpus", backend="nccl", nproc_per_node=2), cluster3.inventory,
                    runs_dir=tmp_path)
    assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
    found = problems(tmp_path, "no-gpus")
    gpus = {p["host"]: p for p in found if p["check"] == "gpus"}
    assert set(gpus) == {n.name for n in cluster3.nodes}
    assert gpus["it3-node0"]["found"] == "0 GPUs"
    assert "nproc_per_node" in gpus["it3-node0"]["fix"]
    assert {p["host"] for p in found if p["check"] == "nccl"} == set(gpus)


def test_verify_on_a_healthy_cluster(cluster3, tmp_path):
    result = verify(job("healthy"), cluster3.inventory, runs_dir=tmp_path)
    assert result.exit_code == Exit.OK, result.reason
    gate = json.loads((tmp_path / "healthy" / "preflight.json").read_text())["gate"]
    assert gate["ok"] and gate["nproc_per_node"] == 1 and gate["world_size"] == 3
    assert_nothing_started(cluster3, "healthy")


def test_small_dev_shm_warns_and_the_nodes_identities_pass(cluster3, tmp_path):
    # The testbed's nodes run with podman's default /dev/shm (64 MB): two processes a node
    # warn, and verify passes all the same.
    result = verify(job("small-shm", nproc_per_node=2), cluster3.inventory, runs_dir=tmp_path)
    assert result.exit_code == Exit.OK, result.reason
    assert result.problems == []
    assert sorted((w["host"], w["check"]) for w in result.warnings) == \
        [(host, "shm") for host in sorted(result.hosts)]
    # podman's 64m is 64000 KiB: 62 MiB.
    assert all(int(w["found"].removesuffix(" MiB")) <= 64 for w in result.warnings), \
        result.warnings
    preflight = json.loads((tmp_path / "small-shm" / "preflight.json").read_text())
    assert preflight["gate"]["warnings"] == result.warnings
    assert "3 warning(s), the job may start" in preflight["gate"]["table"]
    # One kernel, so one boot id, a host name each: NCCL tells them apart, as the check says.
    facts = preflight["facts"]
    assert len({f["boot_id"] for f in facts.values()}) == 1
    assert len({f["hostname"] for f in facts.values()}) == 3
    assert host_identity(facts, {"job": {"env": {}}}) == []
    assert_nothing_started(cluster3, "small-shm")
