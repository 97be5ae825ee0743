"""The start barrier over real sockets on this machine: all nodes come, or none goes."""

from __future__ import annotations

import socket
import threading

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
