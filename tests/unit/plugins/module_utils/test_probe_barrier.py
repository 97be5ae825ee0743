"""The start barrier over real sockets on this machine: all nodes come, or none goes."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils import (
    _probe,
    _probeback,
    _probeproblems,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._probe import (
    ABORT,
    GO,
    Listener,
    barrier,
    bind,
    connect,
    probe,
    run_token,
    wait_word,
)

TOKEN = run_token("r1")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def peers(port: int, count: int, token: str = TOKEN) -> tuple[list[threading.Thread], list]:
    words: list = []

    def peer() -> None:
        reachable, error, sock = connect("127.0.0.1", port, token, 2, 5, keep=True)
        words.append(wait_word(sock, 10)[0] if reachable else error)

    threads = [threading.Thread(target=peer) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, words


def test_every_node_comes_so_every_node_goes():
    port = free_port()
    threads, words = peers(port, 2)  # before the master listens: refused, tried again
    sock, error = bind(port)
    assert error is None
    listener = Listener(sock, TOKEN, 3, 10, hold=True)
    listener.start()
    assert connect("127.0.0.1", port, TOKEN, 2, 5)[:2] == (True, None)
    listener.join()
    assert listener.served == 3
    listener.release(GO)
    for thread in threads:
        thread.join(10)
    assert words == [GO, GO]
    # Nothing of the barrier holds the port any more: torchrun can bind it.
    again, error = bind(port)
    assert error is None
    again.close()


def test_a_missing_node_calls_the_start_off_for_all():
    port = free_port()
    sock, _error = bind(port)
    listener = Listener(sock, TOKEN, 3, 1.0, hold=True)
    listener.start()
    threads, words = peers(port, 1)
    assert connect("127.0.0.1", port, TOKEN, 2, 5)[0]
    listener.join()
    assert listener.served == 2
    listener.release(ABORT)
    for thread in threads:
        thread.join(10)
    assert words == [ABORT]


def test_another_service_on_the_port_does_not_pass():
    port = free_port()
    sock, _error = bind(port)
    listener = Listener(sock, "someone-else", 1, 5)
    listener.start()
    reachable, error, kept = connect("127.0.0.1", port, TOKEN, 2, 5, keep=True)
    listener.join()
    assert not reachable and kept is None
    assert "something else answers" in error


def test_nothing_listening_is_refused_after_the_window():
    reachable, error, _sock = connect("127.0.0.1", free_port(), TOKEN, 1, 0.3)
    assert not reachable and "connection refused for 0.3 s" in error


def test_a_port_in_use_cannot_be_listened_on():
    with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as busy:
        busy.bind(("::" if socket.has_ipv6 else "0.0.0.0", 0))
        busy.listen(1)
        sock, error = bind(busy.getsockname()[1])
    assert sock is None and error.startswith("cannot listen on port")


def test_a_node_that_reads_late_gets_the_token_and_the_word_apart():
    # The last node's token and the master's go can reach it in one segment.
    from ansible_collections.torchherd.cluster.plugins.module_utils._probe import _Lines

    port = free_port()
    sock, _error = bind(port)
    listener = Listener(sock, TOKEN, 1, 5, hold=True)
    listener.start()
    late = socket.create_connection(("127.0.0.1", port))
    listener.join()
    releasing = threading.Thread(target=listener.release, args=(GO,))
    releasing.start()
    lines = _Lines(late)
    assert lines.line(5) == TOKEN
    assert wait_word(lines, 5) == (GO, None)
    releasing.join(5)


def all_at_once(calls):
    """Runs each call in a thread of its own, as one task runs on every node: the results."""
    results: list = [None] * len(calls)

    def one(index, call):
        results[index] = call()

    threads = [threading.Thread(target=one, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_the_token_names_the_run():
    assert TOKEN == "torchherd-r1"


def test_the_probe_alone_answers_every_node_and_holds_nothing():
    port = free_port()
    master, node = all_at_once([
        lambda: probe("127.0.0.1", port, TOKEN, 2, 5, listen=True, expect=2),
        lambda: probe("127.0.0.1", port, TOKEN, 2, 5),
    ])
    assert master[0]["listening"] and master[0]["served"] == 2 and master[1] is None
    assert (master[0]["reachable"], master[0]["error"]) == (True, None)
    assert master[0]["back_failed"] == {} and master[0]["back_error"] is None
    assert node == ({"reachable": True, "error": None, "seconds": node[0]["seconds"],
                     "address": "127.0.0.1", "back_error": None}, None)
    again, error = bind(port)
    assert error is None
    again.close()


def test_the_barrier_lets_every_node_go_once_all_came():
    port = free_port()
    results = all_at_once([
        lambda: barrier("127.0.0.1", port, "r1", 2, 5),  # before the master listens
        lambda: barrier("127.0.0.1", port, "r1", 2, 5, listen=True, expect=3),
        lambda: barrier("127.0.0.1", port, "r1", 2, 5),
    ])
    assert [result["go"] for result in results] == [True, True, True]
    assert results[1]["served"] == 3
    assert [result["error"] for result in results] == [None, None, None]


def test_the_barrier_calls_the_start_off_everywhere_when_a_node_is_missing():
    port = free_port()
    master, node = all_at_once([
        lambda: barrier("127.0.0.1", port, "r1", 2, 1.0, listen=True, expect=3),
        lambda: barrier("127.0.0.1", port, "r1", 2, 1.0),
    ])
    assert (master["go"], master["served"], master["reachable"]) == (False, 2, True)
    assert (node["go"], node["reachable"]) == (False, True)
    assert node["error"] == (f"the start was called off: not every node reached "
                             f"127.0.0.1:{port} (and was reached back) within 1 s")


@pytest.mark.parametrize("refuser", [0, 1])
def test_a_node_that_refuses_calls_the_start_off_everywhere_as_soon_as_all_came(refuser):
    """A relaunch's node whose facts changed comes to the barrier as every node does and says
    it will not start (the master too): every node hears it at once, with its name, and no
    node waits out the window."""
    port = free_port()
    refuse = ["n0", "n1", "n2"][refuser]
    started = time.monotonic()
    results = all_at_once([
        lambda: barrier("127.0.0.1", port, "r1", 2, 20, listen=True, expect=3, name="n0",
                        refuse="torch changed" if refuse == "n0" else None),
        lambda: barrier("127.0.0.1", port, "r1", 2, 20, name="n1",
                        refuse="torch changed" if refuse == "n1" else None),
        lambda: barrier("127.0.0.1", port, "r1", 2, 20, name="n2"),
    ])
    assert time.monotonic() - started < 10  # not the window
    assert [r["go"] for r in results] == [False, False, False]
    assert all(r["refused"] == [refuse] for r in results), results
    assert all(r["reachable"] and not r.get("pairs_failed") for r in results), results
    assert all(f"{refuse}: {_probeproblems.REFUSED}" in r["error"] for r in results)
    # Nothing of the barrier holds the port: the full path's start binds it again.
    again, error = bind(port)
    assert error is None
    again.close()


def test_a_barrier_of_another_run_does_not_pass():
    port = free_port()
    _master, node = all_at_once([
        lambda: barrier("127.0.0.1", port, "r1", 2, 1.0, listen=True, expect=2),
        lambda: barrier("127.0.0.1", port, "r2", 2, 1.0),
    ])
    assert not node["go"] and not node["reachable"]
    assert "something else answers" in node["error"]


def test_a_master_that_cannot_listen_starts_nothing():
    with socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET) as busy:
        busy.bind(("::" if socket.has_ipv6 else "0.0.0.0", 0))
        busy.listen(1)
        result = barrier("127.0.0.1", busy.getsockname()[1], "r1", 1, 0.3, listen=True)
    assert not result["go"] and not result["listening"] and result["served"] == 0
    assert result["error"].startswith("cannot listen on port")


def test_listener_and_barrier_on_a_kernel_without_ipv6(monkeypatch):
    """ipv6.disable=1 (common on HPC nodes): creating an AF_INET6 socket fails; the listener
    falls back to IPv4 and the barrier still goes."""
    real_socket = socket.socket

    def no_ipv6(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(97, "Address family not supported by protocol")
        return real_socket(family, *args, **kwargs)

    monkeypatch.setattr(socket, "socket", no_ipv6)
    sock, error = bind(0)
    assert error is None and sock.family == socket.AF_INET
    sock.close()
    port = free_port()
    threads, words = peers(port, 1)
    result = barrier("127.0.0.1", port, "r1", 2, 5, listen=True, expect=2)
    for thread in threads:
        thread.join()
    assert result["go"] and words == [GO]


def test_a_node_connects_from_its_interface_address():
    port = free_port()
    with socket.create_server(("127.0.0.1", port)) as server:
        seen = []

        def answer() -> None:
            conn, peer = server.accept()
            seen.append(peer[0])
            conn.sendall(TOKEN.encode() + b"\n")
            conn.close()

        thread = threading.Thread(target=answer)
        thread.start()
        reachable, error, _sock = connect("127.0.0.1", port, TOKEN, 2, 2, source="127.0.0.3")
        thread.join()
    assert reachable, error
    assert seen == ["127.0.0.3"]


def test_a_source_address_not_of_this_node_is_named():
    reachable, error, _sock = connect("127.0.0.1", free_port(), TOKEN, 1, 1,
                                      source="192.0.2.254")
    assert not reachable and "192.0.2.254 is not an address of this node" in error


def test_a_node_the_master_cannot_reach_back_stops_the_start(monkeypatch):
    """The job's peers connect to every node: a node whose firewall drops that is found here,
    not as a hang at init. Here the master's connection back to one node fails."""
    from ansible_collections.torchherd.cluster.plugins.module_utils import _probe

    real = _probe.connect_back
    blocked = "127.0.0.3"

    def connect_back(address, port, token, timeout):
        if address == blocked:
            return "timed out after 2 s (dropped: a firewall on the node?)"
        return real(address, port, token, timeout)

    monkeypatch.setattr(_probe, "connect_back", connect_back)
    port = free_port()
    results = all_at_once([
        lambda: barrier("127.0.0.1", port, "r1", 2, 5, listen=True, expect=3),
        lambda: barrier("127.0.0.1", port, "r1", 2, 5, source="127.0.0.2"),
        lambda: barrier("127.0.0.1", port, "r1", 2, 5, source=blocked),
    ])
    assert [result["go"] for result in results] == [False, False, False]
    assert results[0]["back_failed"] == {blocked: "timed out after 2 s (dropped: a firewall "
                                                  "on the node?)"}
    assert results[1]["back_error"] is None and "called off" in results[1]["error"]
    assert "could not open a connection to this node at 127.0.0.3" in results[2]["back_error"]


def test_every_node_connects_to_every_other_at_its_interface_address():
    """The pairs: three nodes on their own addresses, each back port answers the other two.
    The master's job interface (127.0.0.4) is not the master address: the others prove it."""
    port = free_port()
    seen: dict = {}
    real = _probe.connect_back

    def counted(address, port, token, timeout, source=None):
        seen.setdefault(source, set()).add(address)
        return real(address, port, token, timeout, source)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_probe, "connect_back", counted)
        results = all_at_once([
            lambda: barrier("127.0.0.1", port, "r1", 2, 5, listen=True, expect=3,
                            source="127.0.0.4", name="n0"),
            lambda: barrier("127.0.0.1", port, "r1", 2, 5, source="127.0.0.2", name="n1"),
            lambda: barrier("127.0.0.1", port, "r1", 2, 5, source="127.0.0.3", name="n2"),
        ])
    assert [result["go"] for result in results] == [True, True, True]
    assert not any("pairs_failed" in result for result in results)
    # Every node reached both others from its own address (None: the master's connections
    # back, before the pairs).
    assert seen["127.0.0.4"] == {"127.0.0.2", "127.0.0.3"}
    assert seen["127.0.0.2"] == {"127.0.0.4", "127.0.0.3"}
    assert seen["127.0.0.3"] == {"127.0.0.4", "127.0.0.2"}


def closed_to_its_peers(port, name, source):
    """A node that lets the master back in and then no one (its port closes): what a node whose
    firewall admits the master's address alone looks like to its peers."""
    reachable, error, kept = connect("127.0.0.1", port, TOKEN, 2, 5, keep=True, source=source)
    assert reachable, error
    back = _probeback.BackPort(source, TOKEN, 10)
    back.start()
    kept.sock.sendall(f"back {back.port} {name}\n".encode())
    assert back.reached.wait(5)
    back.close()
    return back.port, wait_word(kept, 10, (back, TOKEN, 1))


def test_a_pair_that_cannot_connect_calls_the_start_off_on_every_node_naming_it():
    port = free_port()
    master, node1, (closed_port, (word, said)) = all_at_once([
        lambda: barrier("127.0.0.1", port, "r1", 1, 5, listen=True, expect=3, name="n0"),
        lambda: barrier("127.0.0.1", port, "r1", 1, 5, source="127.0.0.2", name="n1"),
        lambda: closed_to_its_peers(port, "n2", "127.0.0.3"),
    ])
    assert (master["go"], node1["go"], word) == (False, False, ABORT)
    assert master["served"] == 3 and master["back_failed"] == {}
    found = {(p["host"], p["check"]) for p in master["pairs_failed"]}
    assert found == {("n0 -> n2", "peers reachable"), ("n1 -> n2", "peers reachable")}
    # Every node has the master's list, and says it.
    assert node1["pairs_failed"] == master["pairs_failed"] == said
    for problem in said:
        assert f"127.0.0.3:{closed_port}" in problem["expected"]
        assert problem["found"].startswith("connection refused")
    assert node1["error"].startswith("the start was called off on every node: ")
    assert f"n1 -> n2: peers reachable: expected a TCP connection from n1 (127.0.0.2) to n2 " \
           f"at 127.0.0.3:{closed_port}" in node1["error"]
    assert "fix: allow TCP from 127.0.0.2 to 127.0.0.3 on any port" in node1["error"]
    # Nothing of the barrier holds the port: the next launch can bind it.
    again, error = bind(port)
    assert error is None
    again.close()


def test_check_peers_names_each_peer_it_cannot_reach_and_skips_itself():
    mine = _probeback.BackPort("127.0.0.1", TOKEN, 10)
    mine.start()
    other = _probeback.BackPort("127.0.0.2", TOKEN, 10)
    other.start()
    gone = free_port()
    try:
        failed = _probe.check_peers(
            [["me", "127.0.0.1", mine.port], ["ok", "127.0.0.2", other.port],
             ["gone", "127.0.0.4", gone]], mine, TOKEN, 1)
    finally:
        mine.close()
        other.close()
    assert failed == [["gone", "127.0.0.4", gone,
                       "connection refused (rejected: a firewall on the node?)"]]
    assert other.reached.is_set() and not mine.reached.is_set()


def test_the_pairs_message_names_both_nodes_the_addresses_and_the_port():
    problem = _probe.pair_problem("node2", "10.1.0.3", "node3", "10.1.0.4", 29531,
                                  "timed out after 3 s (dropped: a firewall on the node?)")
    assert problem["host"] == "node2 -> node3" and problem["check"] == "peers reachable"
    assert "from node2 (10.1.0.3) to node3 at 10.1.0.4:29531" in problem["expected"]
    assert problem["found"].startswith("timed out after 3 s")
    assert "allow TCP from 10.1.0.3 to 10.1.0.4" in problem["fix"]
    said = _probeproblems.describe([problem] * 7)
    assert said.startswith("node2 -> node3: peers reachable: expected ")
    assert said.count("node2 -> node3") == 5 and said.endswith("and 2 more")


def test_the_pairs_take_a_round_of_connections_per_64_peers():
    assert _probe.pair_seconds(1, 3) == 1  # one node: nothing to connect
    assert _probe.pair_seconds(32, 3) == 7  # 31 peers at once: one round
    assert _probe.pair_seconds(65, 3) == 7
    assert _probe.pair_seconds(66, 3) == 13


def _unanswered_first(monkeypatch, times):
    """socket.create_connection as _probe calls it, left unanswered (a firewall dropping the
    SYN) the first `times` tries."""
    real, calls = socket.create_connection, []

    def create_connection(*args, **kwargs):
        calls.append(args)
        if len(calls) <= times:
            raise TimeoutError("timed out")
        return real(*args, **kwargs)

    monkeypatch.setattr(_probe.socket, "create_connection", create_connection)
    return calls


def test_in_the_barrier_an_unanswered_connection_is_tried_again_within_the_window(monkeypatch):
    # Every node opens its own rules in its start: the master's may come after a node's
    # first try, which its firewall then drops.
    port = free_port()
    sock, _error = bind(port)
    listener = Listener(sock, TOKEN, 1, 5)
    listener.start()
    calls = _unanswered_first(monkeypatch, 2)
    reachable, error, _kept = connect("127.0.0.1", port, TOKEN, 1, 5, unanswered=True)
    listener.join()
    assert reachable and error is None and len(calls) == 3


def test_elsewhere_an_unanswered_connection_fails_at_once(monkeypatch):
    calls = _unanswered_first(monkeypatch, 1)
    reachable, error, _kept = connect("127.0.0.1", free_port(), TOKEN, 1, 5)
    assert not reachable and error.startswith("timed out after 1 s connecting") and len(calls) == 1


def test_in_the_barrier_a_connection_unanswered_for_the_whole_window_fails_as_before(monkeypatch):
    calls = _unanswered_first(monkeypatch, 10**6)
    reachable, error, _kept = connect("127.0.0.1", free_port(), TOKEN, 1, 0.3, unanswered=True)
    assert not reachable and error.startswith("timed out after 1 s connecting"), error
    assert len(calls) >= 2
