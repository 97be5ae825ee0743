"""The container cluster behaves like separate machines reached over real SSH."""

from __future__ import annotations

import shlex
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.cluster import testbed

pytestmark = pytest.mark.cluster

LISTENER = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
server.settimeout(30)
print("ready", flush=True)
conn, _ = server.accept()
conn.sendall(("hello from " + socket.gethostname()).encode())
conn.close()
"""
CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as conn:
    print(conn.recv(100).decode())
"""


def test_nodes_are_separate_machines_with_torch(cluster3: testbed.Cluster) -> None:
    nodes = cluster3.nodes
    assert [node.name for node in nodes] == ["it3-node0", "it3-node1", "it3-node2"]

    def probe(node: testbed.Node) -> tuple[str, str]:
        hostname = cluster3.ssh(node, ["hostname"]).stdout.strip()
        torch_version = cluster3.ssh(
            node, ["/usr/bin/python3", "-c", "import torch; print(torch.__version__)"]
        ).stdout.strip()
        return hostname, torch_version

    with ThreadPoolExecutor(len(nodes)) as pool:
        probes = list(pool.map(probe, nodes))
    assert [hostname for hostname, _ in probes] == [node.name for node in nodes]
    # The local CPU build reports "2.13.0+cpu".
    assert [version.split("+")[0] for _, version in probes] == ["2.13.0"] * len(nodes)

    marker = f"/root/testbed-{uuid.uuid4().hex}"
    cluster3.ssh(0, ["touch", marker])
    try:
        assert cluster3.ssh(0, ["test", "-e", marker], check=False).returncode == 0
        assert cluster3.ssh(1, ["test", "-e", marker], check=False).returncode == 1
    finally:
        cluster3.ssh(0, ["rm", "-f", marker])


def test_nodes_reach_each_other_by_ip(cluster3: testbed.Cluster) -> None:
    port = "29511"
    listener = subprocess.Popen(
        [*cluster3.ssh_argv(0), shlex.join(["python3", "-c", LISTENER, port])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "ready"
        reply = cluster3.ssh(1, ["python3", "-c", CLIENT, cluster3.nodes[0].ip, port])
        assert reply.stdout.strip() == f"hello from {cluster3.nodes[0].name}"
        assert listener.wait(timeout=10) == 0
    finally:
        listener.kill()
        listener.communicate()
