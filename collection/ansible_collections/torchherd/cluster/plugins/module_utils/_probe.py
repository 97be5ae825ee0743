# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The master-port probe: a listener on the master that answers a token, and the nodes that
connect to it. Used alone (tcp_probe, probe()) and as the start barrier of torchrun_job
(barrier()), where the listener also tells every node when all have come, so that no node
starts unless all can.

Both ways: after the token, every node names a port it listens on at the address it connected
from (its job interface's), and the master connects back to it there. The job's peers do the
same (gloo and NCCL listen on every node, at the interface's address, on ports the kernel
picks), so a node whose firewall drops them, or whose address has no way back, is found here
and not as a hang at init."""

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

    def __init__(self, sock, token, expect, seconds, hold=False, timeout=3.0):
        super().__init__(daemon=True)
        self.sock, self.token, self.expect, self.hold = sock, token.encode() + b"\n", expect, hold
        self.deadline = time.monotonic() + seconds
        self.timeout = timeout
        self.served = 0
        self.held = []
        # Address a node connected from -> why the master could not connect back (None: it
        # could); filled by one thread per node, so that a slow node delays nobody.
        self.back = {}
        self._checks = []
        self._lock = threading.Lock()

    def run(self):
        try:
            while self.served < self.expect and time.monotonic() < self.deadline:
                self.sock.settimeout(max(0.05, self.deadline - time.monotonic()))
                # socket.timeout, not TimeoutError: the two are one only from Python 3.10 on.
                try:
                    conn, peer = self.sock.accept()
                except socket.timeout:
                    break
                try:
                    conn.sendall(self.token)
                except OSError:
                    conn.close()
                    continue
                # The dual-stack socket shows IPv4 peers as ::ffff:a.b.c.d.
                address = peer[0][7:] if peer[0].startswith("::ffff:") and "." in peer[0] \
                    else peer[0]
                check = threading.Thread(target=self._check_back, args=(conn, address),
                                         daemon=True)
                check.start()
                self._checks.append(check)
                self.served += 1
        finally:
            self.sock.close()
            for check in self._checks:
                check.join()

    def _check_back(self, conn, address):
        """Read the node's "back PORT" and connect to it there, as the job's peers will."""
        try:
            words = _read_line(conn, self.timeout).split()
        except OSError:
            words = []
        if len(words) == 2 and words[0] == BACK and words[1].isdigit():
            error = connect_back(address, int(words[1]), self.token, self.timeout)
        else:
            error = None  # a probe that offers no way back (nothing to check)
        with self._lock:
            self.back[address] = error
            if self.hold:
                self.held.append(conn)
                return
        conn.close()

    def back_failed(self):
        """Address -> error of every node the master could not connect back to."""
        return {address: error for address, error in self.back.items() if error}

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


BACK = "back"


def _read_line(conn, timeout):
    """One line from a socket without buffering past it (the master's word comes later)."""
    conn.settimeout(timeout)
    data = b""
    while not data.endswith(b"\n") and len(data) < 256:
        chunk = conn.recv(1)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def connect_back(address, port, token, timeout):
    """The master's connection to a node's back port: None, or why it failed."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            answer = _read_line(sock, timeout)
    except socket.timeout:
        return f"timed out after {timeout:g} s (dropped: a firewall on the node?)"
    except ConnectionRefusedError:
        return "connection refused (rejected: a firewall on the node?)"
    except OSError as exc:
        return exc.strerror or str(exc)
    return None if answer.encode() + b"\n" == token else f"something else answered: {answer!r}"


class _BackPort(threading.Thread):
    """A node's port for the master's connection back, at the address it connected from."""

    def __init__(self, address, token, seconds):
        super().__init__(daemon=True)
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.bind((address, 0))
            self.sock.listen(1)
        except OSError:
            self.sock.close()
            raise
        self.port = self.sock.getsockname()[1]
        self.token, self.seconds = token.encode() + b"\n", seconds
        self.reached = threading.Event()

    def run(self):
        try:
            self.sock.settimeout(self.seconds)
            conn = self.sock.accept()[0]
            try:
                conn.sendall(self.token)
            finally:
                conn.close()
            self.reached.set()
        except OSError:
            pass
        finally:
            self.sock.close()

    def close(self):
        """Stop listening (the accept above ends): no port of the probe outlives it."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _offer_back(sock, token, seconds):
    """Listen at the connection's local address and tell the master the port; None where
    the node cannot listen there (it says so, and the master checks nothing back)."""
    try:
        back = _BackPort(sock.getsockname()[0], token, seconds)
    except OSError:
        back = None
    else:
        back.start()
    try:
        sock.sendall(f"{BACK} {back.port if back else '-'}\n".encode())
    except OSError:
        return None
    return back


def back_error(back, address, seconds):
    """Why the master did not reach this node back, or None."""
    if back is None:
        return None
    reached = back.reached.wait(seconds)
    back.close()
    back.join(1)
    if reached:
        return None
    return (f"the master could not open a connection to this node at {address} (as the job's "
            f"peers must: gloo and NCCL listen on every node, on ports the kernel picks): a "
            f"firewall on this node dropping them, or no way back to {address}")


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
    """The master's word on a kept connection: (GO or ABORT, the gang port the master named
    with its go, or None); ABORT if it never comes."""
    try:
        words = lines.line(seconds).split()
    except OSError:
        words = []
    finally:
        lines.close()
    if words and words[0] == GO:
        return GO, int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    return ABORT, None


def run_token(run_id):
    """What the listener answers for a run: names it, so that no other service passes."""
    return f"torchherd-{run_id}"


def probe(host, port, token, timeout, window, listen=False, expect=1, hold=False, source=None):
    """One node's part of the probe, run on every node at once: the master (`listen`) answers up
    to `expect` nodes for `window` seconds while every node, the master too, connects to
    host:port, retries a refused connection for `window` seconds and waits `timeout` seconds
    for the handshake and the token, from the local address `source` where given. Then the
    master connects back to every node at the address it came from (see the module's doc).

    Returns (result, held). result: reachable, error, seconds (to connect and read the token),
    address (the local address the node connected from), back_error (why the master could not
    connect back to it, or None), and on the master listening, served and back_failed (address
    -> error). With `hold`, held is what the barrier decides on: the master's Listener keeping
    the nodes' connections (for release()), or a node's (kept connection, back port) for
    wait_word(); else None."""
    started = time.monotonic()
    result = {"back_error": None}
    listener = None
    if listen:
        sock, error = bind(port)
        result["listening"] = sock is not None
        if sock is None:
            return dict(result, reachable=False, error=error, seconds=0.0, served=0), None
        listener = Listener(sock, token, expect, window, hold=hold, timeout=timeout)
        listener.start()
    reachable, error, kept = connect(host, port, token, timeout, window, keep=True,
                                     source=source)
    result.update(reachable=reachable, error=error, seconds=round(time.monotonic() - started, 3))
    back = None
    if reachable:
        result["address"] = kept.sock.getsockname()[0]
        back = _offer_back(kept.sock, token, window + 2 * timeout + 5)
    if listener is None and hold:
        return result, (kept, back)
    if kept is not None:
        kept.close()
    if listener is not None:
        # The other nodes are still connecting: answer them until all came or time is up.
        listener.join()
        result.update(served=listener.served, back_failed=listener.back_failed())
    if reachable:
        result["back_error"] = back_error(back, result["address"], timeout + 1)
    return result, listener if hold else None


def barrier(host, port, run_id, timeout, window, listen=False, expect=1, source=None,
            gang=None):
    """The probe as a start barrier: every node reaches the master port and the master reaches
    every node back, or none starts.

    The probe's result plus `go`: the master tells each node to go only once all `expect`
    nodes have come and it reached each of them back, and to abort otherwise. With `gang` (a
    listening socket, on the master) the go names its port, and every node's result has
    `gang_port`: the node-side gang (see _gang) meets there."""
    result, held = probe(host, port, run_token(run_id), timeout, window, listen, expect,
                         hold=True, source=source)
    if listen:
        go = (result["reachable"] and result["served"] >= expect and not result["back_failed"]
              and not result["back_error"])
        if held is not None:
            word = GO if not go or gang is None else f"{GO} {gang.getsockname()[1]}"
            held.release(word if go else ABORT)
        return dict(result, go=go, gang_port=gang.getsockname()[1] if gang else None)
    if not result["reachable"]:
        return dict(result, go=False)
    kept, back = held
    word, result["gang_port"] = wait_word(kept, window + 2 * timeout + 5)
    go = word == GO
    # The master decided after its connections back: by now this node's was made or not.
    result["back_error"] = back_error(back, result["address"], 0.5)
    if not go and not result["back_error"]:
        result["error"] = (f"the start was called off: not every node reached {host}:{port} "
                           f"(and was reached back) within {window:g} s")
    return dict(result, go=go)
