# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The master-port probe: a listener on the master that answers a token, and the nodes that
connect to it. Used alone (tcp_probe, probe()) and as the start barrier of torchrun_job
(barrier()), where the listener also tells every node when all have come, so that no node
starts unless all can."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time

GO = "go"
ABORT = "abort"


def bind(port):
    """(listening socket, None) or (None, reason)."""
    last = None
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        # A kernel without IPv6 (ipv6.disable=1, common on HPC nodes) refuses the AF_INET6
        # socket itself: then plain IPv4.
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            last = exc
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # One dual-stack socket where the node has IPv6, else plain IPv4.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((addr, port))
            sock.listen(64)
            return sock, None
        except OSError as exc:
            last = exc
            sock.close()
    reason = os.strerror(last.errno) if last.errno else str(last)
    return None, f"cannot listen on port {port}: {reason}"


class Listener(threading.Thread):
    """Answers up to `expect` connections with the token, for at most `seconds`. With `hold`,
    keeps them open for release()."""

    def __init__(self, sock, token, expect, seconds, hold=False):
        super().__init__(daemon=True)
        self.sock, self.token, self.expect, self.hold = sock, token.encode() + b"\n", expect, hold
        self.deadline = time.monotonic() + seconds
        self.served = 0
        self.held = []

    def run(self):
        try:
            while self.served < self.expect and time.monotonic() < self.deadline:
                self.sock.settimeout(max(0.05, self.deadline - time.monotonic()))
                # socket.timeout, not TimeoutError: the two are one only from Python 3.10 on.
                try:
                    conn = self.sock.accept()[0]
                except socket.timeout:
                    break
                try:
                    conn.sendall(self.token)
                except OSError:
                    conn.close()
                    continue
                if self.hold:
                    self.held.append(conn)
                else:
                    conn.close()
                self.served += 1
        finally:
            self.sock.close()

    def release(self, word):
        """Tell every held connection `word`; the nodes close first, so that no TIME_WAIT
        socket of the master holds the port that torchrun binds next."""
        for conn in self.held:
            try:
                conn.sendall(word.encode() + b"\n")
            except OSError:
                pass
        for conn in self.held:
            try:
                conn.settimeout(2)
                conn.recv(16)
            except OSError:
                pass
            conn.close()
        self.held = []


class _Lines:
    """Lines from a connected socket, one at a time: the token and the master's word may
    arrive in one segment when a node reads late."""

    def __init__(self, sock):
        self.sock = sock
        self.reader = sock.makefile("rb")

    def line(self, timeout):
        self.sock.settimeout(timeout)
        return self.reader.readline(256).decode(errors="replace").strip()

    def close(self):
        self.reader.close()
        self.sock.close()


def connect(host, port, token, timeout, window, keep=False, source=None):
    """(reachable, error, socket or None). A refused connection is tried again until `window`
    seconds have passed: the master may start listening a moment after a node first tries.
    With `keep`, the connection stays open for wait_word(). With `source`, it leaves from that
    local address: the master's answer must then come back to it, which proves the path the
    job's peers take to this node's interface."""
    deadline = time.monotonic() + window
    while True:
        start = time.monotonic()
        try:
            sock = socket.create_connection((host, port), timeout=timeout,
                                            source_address=(source, 0) if source else None)
        except ConnectionRefusedError:
            if time.monotonic() + 0.1 < deadline:
                time.sleep(0.1)
                continue
            return False, (f"connection refused for {window:g} s (nothing listens there, "
                           f"or a firewall rejects it)"), None
        except socket.timeout:
            via = f" from {source}" if source else ""
            return False, (f"timed out after {timeout:g} s connecting{via} (a firewall dropping "
                           f"the port, or no way back to {source or 'this node'}?)"), None
        except OSError as exc:
            if source and exc.errno == errno.EADDRNOTAVAIL:
                return False, f"{source} is not an address of this node", None
            unreachable = exc.errno == errno.EHOSTUNREACH
            return False, "no route to host" if unreachable else (exc.strerror or str(exc)), None
        lines = _Lines(sock)
        try:
            answer = lines.line(max(0.1, timeout - (time.monotonic() - start)))
        except OSError as exc:
            lines.close()
            return False, f"no answer from {host}:{port} ({exc})", None
        if answer != token:
            lines.close()
            return False, (f"something else answers on {host}:{port} (not the master's "
                           f"probe listener): is {host} the master's address?"), None
        if keep:
            return True, None, lines
        lines.close()
        return True, None, None


def wait_word(lines, seconds):
    """The master's word on a kept connection (GO or ABORT), ABORT if it never comes."""
    try:
        word = lines.line(seconds)
    except OSError:
        word = ""
    finally:
        lines.close()
    return word if word in (GO, ABORT) else ABORT


def run_token(run_id):
    """What the listener answers for a run: names it, so that no other service passes."""
    return f"torchherd-{run_id}"


def probe(host, port, token, timeout, window, listen=False, expect=1, hold=False, source=None):
    """One node's part of the probe, run on every node at once: the master (`listen`) answers up
    to `expect` nodes for `window` seconds while every node, the master too, connects to
    host:port, retries a refused connection for `window` seconds and waits `timeout` seconds
    for the handshake and the token, from the local address `source` where given.

    Returns (result, held). result: reachable, error, seconds (to connect and read the token),
    and on the master listening and served. With `hold`, held is what the barrier decides on:
    the master's Listener keeping the nodes' connections (for release()), or a node's kept
    connection (for wait_word()); else None."""
    started = time.monotonic()
    result = {}
    listener = None
    if listen:
        sock, error = bind(port)
        result["listening"] = sock is not None
        if sock is None:
            return dict(result, reachable=False, error=error, seconds=0.0, served=0), None
        listener = Listener(sock, token, expect, window, hold=hold)
        listener.start()
    reachable, error, kept = connect(host, port, token, timeout, window,
                                     keep=hold and listener is None, source=source)
    result.update(reachable=reachable, error=error, seconds=round(time.monotonic() - started, 3))
    if listener is None:
        return result, kept
    # The other nodes are still connecting: answer them until all came or time is up.
    listener.join()
    result["served"] = listener.served
    return result, listener if hold else None


def barrier(host, port, run_id, timeout, window, listen=False, expect=1, source=None):
    """The probe as a start barrier: every node reaches the master port, or none starts.

    The probe's result plus `go`: the master tells each node to go only once all `expect`
    nodes have come, and to abort otherwise."""
    result, held = probe(host, port, run_token(run_id), timeout, window, listen, expect,
                         hold=True, source=source)
    if listen:
        go = result["reachable"] and result["served"] >= expect
        if held is not None:
            held.release(GO if go else ABORT)
        return dict(result, go=go)
    go = result["reachable"] and wait_word(held, window + timeout + 5) == GO
    if result["reachable"] and not go:
        result["error"] = (f"the start was called off: not every node reached {host}:{port} "
                           f"within {window:g} s")
    return dict(result, go=go)
