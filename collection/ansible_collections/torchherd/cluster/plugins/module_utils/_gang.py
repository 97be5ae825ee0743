# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The gang on the nodes themselves: the first failure anywhere stops the job everywhere,
without the controller.

The controller's watch stops the gang too (watch.yml), but only for the nodes it watches at
the time: with fewer Ansible forks than nodes it waits on some nodes while the others wait for
a worker. So where the start runs in the background (its barrier in the supervisor, see
_supervisor), the supervisors keep a connection of their own: every node's to the master's,
on a port the master names with the barrier's go. A node whose launcher ends says so
("exit CODE"); the master answers a failure (or, with a static rendezvous, a node gone without
a word) by telling every node to stop, and stops its own. A node that loses the master stops
too (static). Elastic jobs leave lost nodes to torchrun.

Without restarts a node does not wait for its launcher's exit to say it failed: the moment one
of its workers ends with an error, it says so (_supervisor's worker watch). torchrun takes
0.5 s on an idle node to notice and end, and 10 s and more when every node's launcher handles
the same failure at once on shared cores."""

from __future__ import annotations

import socket
import threading
import time

STOP = "stop"
EXIT = "exit"
# A node's first word on its link: its name, so that the master can name a node it loses.
JOIN = "join"
# The master's last word when it leaves with its job ended: its link closing is then no loss.
BYE = "bye"


class _Link:
    """One connection, a line at a time."""

    def __init__(self, sock):
        self.sock = sock
        # A node that dies without closing its link (power, kernel) is found in about 25 s.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
        self.reader = sock.makefile("rb")
        self.lock = threading.Lock()

    def say(self, text):
        with self.lock:
            try:
                self.sock.sendall(text.encode() + b"\n")
                return True
            except OSError:
                return False

    def lines(self):
        """Lines until the connection closes."""
        while True:
            try:
                line = self.reader.readline(256)
            except OSError:
                return
            if not line:
                return
            yield line.decode(errors="replace").strip()

    def close(self):
        # shutdown first: it wakes a thread blocked reading this link (the file's close would
        # wait for that read to end).
        for closing in (lambda: self.sock.shutdown(socket.SHUT_RDWR), self.reader.close,
                        self.sock.close):
            try:
                closing()
            except OSError:
                pass


class Master:
    """The master's side: answers the other nodes' links (up to `expect` of them, for
    `window` seconds) and calls `stop(why)` for its own job on the first failure.
    `formed(joined, expected)` is called once no more links are taken: a gang that every node
    joined speaks for all of them (the controller may then watch the master alone)."""

    def __init__(self, sock, expect, window, stop, elastic=False, formed=None):
        self.sock, self.expect, self.stop, self.elastic = sock, expect, stop, elastic
        self.formed = formed
        self.deadline = time.monotonic() + window
        self.links = []
        self.failed = None
        # The nodes whose link closed without an exit: names (or addresses, before a name).
        self.lost = []
        self.lost_at = {}  # when each was lost (this node's clock)
        self.lock = threading.Lock()
        self.readers = []
        self.accepter = threading.Thread(target=self._accept, daemon=True)
        self.accepter.start()

    def _accept(self):
        try:
            while len(self.links) < self.expect and time.monotonic() < self.deadline:
                self.sock.settimeout(max(0.05, self.deadline - time.monotonic()))
                try:
                    conn, peer = self.sock.accept()
                except socket.timeout:
                    break
                link = _Link(conn)
                with self.lock:
                    self.links.append(link)
                    if self.failed:  # a node that comes after the failure stops at once
                        link.say(STOP)
                reader = threading.Thread(target=self._read, args=(link, peer[0]), daemon=True)
                reader.start()
                self.readers.append(reader)
        except OSError:
            pass
        finally:
            self.sock.close()
            if self.formed is not None:
                self.formed(len(self.links), self.expect)

    def _read(self, link, peer):
        said = None
        name = None
        for line in link.lines():
            words = line.split()
            if len(words) == 2 and words[0] == JOIN:
                name = words[1]
            elif len(words) == 3 and words[0] == EXIT:
                said = int(words[2]) if words[2].lstrip("-").isdigit() else 1
                if said != 0:
                    self.fail(f"{words[1]} ended with exit code {said}")
        if said is None:
            with self.lock:
                self.lost.append(name or peer)
                self.lost_at[name or peer] = time.time()
            if not self.elastic:
                self.fail(f"{name or 'the node'} at {peer} was lost (its link closed without "
                          f"an exit)")

    def fail(self, why, own=False):
        """Stop every node, once; this one too unless the failure is its own (`own`: its
        launcher ends by itself)."""
        with self.lock:
            if self.failed:
                return
            self.failed = why
            links = list(self.links)
        for link in links:
            link.say(f"{STOP} {why}")
        if not own:
            self.stop(why)

    def worker_failed(self, code, name):
        """A worker here ended with `code` while the launcher still runs: stop the others now."""
        self.fail(f"{name} ended with exit code {code}", own=True)

    def own_exit(self, code, name, linger=None):
        """This node's launcher ended: a failure stops the others; then wait for their word
        (the links close as their launchers end) so that late failures are still passed on,
        and so that the master's supervisor ends only once the job has ended on every node
        of the gang. A node that died without closing its link is found by TCP keepalive
        (about 25 s); `linger` bounds the wait besides (None: no bound)."""
        if code != 0:
            self.fail(f"{name} ended with exit code {code}")
        self.accepter.join()
        deadline = None if linger is None else time.monotonic() + linger
        for reader in self.readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for link in self.links:
            link.say(BYE)
            link.close()


class Member:
    """Another node's side: its link to the master. `stop(why)` ends this node's job when the
    master says so, or (static) when the master is gone."""

    def __init__(self, host, port, source, timeout, stop, name, elastic=False):
        self.stop, self.name, self.elastic = stop, name, elastic
        self.done = threading.Event()
        self.link = None
        self.error = None
        try:
            sock = socket.create_connection((host, port), timeout=timeout,
                                            source_address=(source, 0) if source else None)
            sock.settimeout(None)
            self.link = _Link(sock)
            self.link.say(f"{JOIN} {name}")
        except OSError as exc:
            self.error = f"no link to the master's gang at {host}:{port}: {exc}"
            return
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.link.lines():
            if self.done.is_set():
                return  # this node's job ended already: nothing to stop
            if line.split()[:1] == [STOP]:
                self.stop(line[len(STOP):].strip() or "the master said stop")
                return
            if line == BYE:
                return
        if not self.done.is_set() and not self.elastic:
            self.stop("the master node was lost (its link closed)")

    def worker_failed(self, code, name):
        """A worker here ended with `code` while the launcher still runs: the master hears of
        it now (and stops the others); a stop it sends back is not for this node."""
        self.done.set()
        if self.link is not None:
            self.link.say(f"{EXIT} {name} {code}")

    def own_exit(self, code):
        self.done.set()
        if self.link is not None:
            self.link.say(f"{EXIT} {self.name} {code}")
            self.link.close()
