"""The start barrier over real sockets on this machine: all nodes come, or none goes."""

from __future__ import annotations

import socket
import threading

from ansible_collections.torchherd.cluster.plugins.module_utils._probe import (
    ABORT,
    GO,
    Listener,
    bind,
    connect,
    wait_word,
)

TOKEN = "torchherd-r1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def peers(port: int, count: int, token: str = TOKEN) -> tuple[list[threading.Thread], list]:
    words: list = []

    def peer() -> None:
        reachable, error, sock = connect("127.0.0.1", port, token, 2, 5, keep=True)
        words.append(wait_word(sock, 10) if reachable else error)

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
    assert wait_word(lines, 5) == GO
    releasing.join(5)
