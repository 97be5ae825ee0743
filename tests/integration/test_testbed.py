"""The container cluster behaves like separate machines reached over real SSH."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

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


@contextmanager
def listening(cluster: testbed.Cluster, node: int,
              argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    """argv on the node (started over SSH, the management network) once it printed "ready",
    until the end of the block."""
    listener = subprocess.Popen(
        [*cluster.ssh_argv(node), shlex.join(argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None
        assert listener.stdout.readline().strip() == "ready"
        yield listener
    finally:
        listener.kill()
        listener.communicate()


def test_nodes_reach_each_other_by_ip(cluster3: testbed.Cluster) -> None:
    port = "29511"
    with listening(cluster3, 0, ["python3", "-c", LISTENER, port]) as listener:
        reply = cluster3.ssh(1, ["python3", "-c", CLIENT, cluster3.nodes[0].ip, port])
        assert reply.stdout.strip() == f"hello from {cluster3.nodes[0].name}"
        assert listener.wait(timeout=10) == 0


# Serves size bytes to every connection until idle for 30 s (a killed SSH client leaves it).
SERVER = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
server.settimeout(30)
payload = b"x" * int(sys.argv[2])
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        conn.sendall(payload)
"""
# Reads a connection to the end: {"got": bytes, "seconds": from connect to EOF} or {"error"}.
FETCH = """
import json, socket, sys, time
host, port, connect_timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
start = time.monotonic()
got = 0
try:
    with socket.create_connection((host, port), timeout=connect_timeout) as conn:
        conn.settimeout(60)
        while chunk := conn.recv(1 << 16):
            got += len(chunk)
except OSError as exc:
    print(json.dumps({"error": repr(exc)}))
else:
    print(json.dumps({"got": got, "seconds": time.monotonic() - start}))
"""
# What a node sees of its own network: links with MAC and addresses, default routes, and the
# addresses its hostname resolves to.
NET_PROBE = """
import json, socket, subprocess
def ip(*args):
    out = subprocess.run(["ip", "-j", *args], capture_output=True, text=True, check=True).stdout
    return json.loads(out or "[]")
def addresses(link, family):
    return [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == family]
links = {
    link["ifname"]: {
        "mac": link.get("address"),
        "v4": addresses(link, "inet"),
        "v6": addresses(link, "inet6"),
    }
    for link in ip("addr", "show")
}
routes = [[r.get("gateway"), r.get("dev")] for r in ip("route", "show", "default")]
own = socket.gethostbyname_ex(socket.gethostname())[2]
print(json.dumps({"links": links, "default_routes": routes, "own_addresses": own}))
"""
PAYLOAD = 2_000_000
THROTTLED_RATE = "4mbit"  # 2 MB in about 4 s


@pytest.fixture(scope="module")
def data_cluster(node_image: str) -> Iterator[testbed.Cluster]:
    """tb2n: 3 nodes with a data network, node 2 without IPv6; its own subnet index.
    conftest's make_cluster passes no such options to up(), hence this fixture."""
    with testbed.reserve("tb2n"):
        try:
            yield testbed.up("tb2n", 3, data_network=True, no_ipv6=[2])
        finally:
            testbed.down("tb2n")


@contextmanager
def serving(cluster: testbed.Cluster, node: int, port: int) -> Iterator[None]:
    """SERVER on the node while in the block."""
    with listening(cluster, node, ["python3", "-c", SERVER, str(port), str(PAYLOAD)]):
        yield


def fetch(
    cluster: testbed.Cluster, node: int, host: str, port: int, connect_timeout: float = 5.0
) -> dict[str, Any]:
    argv = ["python3", "-c", FETCH, host, str(port), str(connect_timeout)]
    return json.loads(cluster.exec(node, argv, timeout=90).stdout)


def probe_network(cluster: testbed.Cluster, node: testbed.Node) -> dict[str, Any]:
    return json.loads(cluster.exec(node, ["python3", "-c", NET_PROBE]).stdout)


def test_data_network_nodes_look_real(data_cluster: testbed.Cluster) -> None:
    cluster, nodes = data_cluster, data_cluster.nodes
    # Names as designed: no two of the three nodes share an interface name.
    assert [(n.mgmt_if, n.data_if) for n in nodes] == [
        ("eth0", "data0"),
        ("mgmt0", "ib0"),
        ("eno1", "enp65s0f1"),
    ]
    assert testbed.attach("tb2n").nodes == nodes  # rebuilt from the container labels

    with ThreadPoolExecutor(len(nodes)) as pool:
        probes = list(pool.map(lambda node: probe_network(cluster, node), nodes))
    for node, probe in zip(nodes, probes, strict=True):
        assert node.data_ip is not None and node.data_if is not None
        links = probe["links"]
        assert set(links) == {"lo", node.mgmt_if, node.data_if}, node.name
        assert links[node.mgmt_if]["v4"] == [f"{node.ip}/24"]
        assert links[node.data_if]["v4"] == [f"{node.data_ip}/24"]
        assert links[node.mgmt_if]["mac"] == testbed.mac_for(node.ip)
        assert links[node.data_if]["mac"] == testbed.mac_for(node.data_ip)
        assert testbed.mac_for(node.data_ip) != testbed.mac_for(node.ip)
        # Out of the cluster only through the management network; no route over the data one.
        gateway = node.ip.rsplit(".", 1)[0] + ".1"
        assert probe["default_routes"] == [[gateway, node.mgmt_if]], node.name
        assert probe["own_addresses"] == [node.ip], node.name  # as DNS answers for the others
    assert all(any(link["v6"] for link in p["links"].values()) for p in probes[:2])
    assert not any(link["v6"] for link in probes[2]["links"].values())
    # ...and the node without IPv6 is still reached over SSH.
    assert cluster.ssh(2, ["ip", "-6", "addr"]).stdout.strip() == ""

    port = 29611
    with serving(cluster, 1, port):
        target = nodes[1]
        assert target.data_ip is not None
        for client in (0, 2):
            fetched = fetch(cluster, client, target.data_ip, port)
            assert fetched.get("got") == PAYLOAD, (client, fetched)
        # The management network carries SSH only: the same port there is dropped, although
        # the node itself reaches its listener on that address (over lo, not the firewall).
        refused = fetch(cluster, 0, target.ip, port, connect_timeout=2)
        assert "timed out" in refused.get("error", ""), refused
        assert fetch(cluster, 1, target.ip, port).get("got") == PAYLOAD

    inventory = cluster.inventory.read_text()
    for node in nodes:
        assert f"{node.name} ansible_host={node.ip} torchherd_address={node.data_ip}\n" in inventory
    extra_vars = {"node1": {"torchherd_socket_ifname": "ib0", "torchherd_note": "two words"}}
    written = cluster.write_inventory(host_vars=extra_vars)
    assert written.parent == cluster.inventory.parent and written != cluster.inventory
    listed = subprocess.run(
        [sys.executable, "-m", "ansible", "inventory", "-i", str(written), "--list"],
        capture_output=True,
        text=True,
        check=True,
    )
    hostvars = json.loads(listed.stdout)["_meta"]["hostvars"]
    assert hostvars["tb2n-node1"]["torchherd_socket_ifname"] == "ib0"
    assert hostvars["tb2n-node1"]["torchherd_note"] == "two words"
    assert hostvars["tb2n-node0"]["torchherd_address"] == nodes[0].data_ip
    assert hostvars["tb2n-node0"]["ansible_host"] == nodes[0].ip
    assert "torchherd_socket_ifname" not in hostvars["tb2n-node0"]


def test_data_network_throttled_link_is_slower(data_cluster: testbed.Cluster) -> None:
    cluster, sender = data_cluster, data_cluster.nodes[1]
    assert sender.data_ip is not None
    port = 29612
    with serving(cluster, 1, port):  # node1 sends: tbf shapes what leaves its data link
        before = fetch(cluster, 0, sender.data_ip, port)
        cluster.throttle(1, THROTTLED_RATE)
        try:
            throttled = fetch(cluster, 0, sender.data_ip, port)
        finally:
            cluster.unthrottle(1)
        after = fetch(cluster, 0, sender.data_ip, port)
    print(f"2 MB node1 -> node0: {before}, at {THROTTLED_RATE} {throttled}, unthrottled {after}")
    assert before["got"] == throttled["got"] == after["got"] == PAYLOAD
    # 2 MB at 4 Mbit/s is 4 s; unthrottled it is milliseconds. Generous margins: 2 cores, noisy.
    assert throttled["seconds"] > 2.0
    assert throttled["seconds"] > 3 * before["seconds"]
    assert throttled["seconds"] > 3 * after["seconds"]
    cluster.unthrottle(1)  # a second time: fine when not throttled
