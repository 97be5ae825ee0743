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
the same failure at once on shared cores.

The links also carry each node's last line of the job to the master ("line NAME TEXT", a word
older masters pass over), so that a live view learns every node's line from the master's
record alone: a node says its line when it changed, at most once every LINE_EVERY s; the
master keeps every node's latest and hands them on (its record's gang section) as often."""

from __future__ import annotations

import os
import socket
import threading
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import job_line
from ansible_collections.torchherd.cluster.plugins.module_utils._use import IDLE, WORKING

STOP = "stop"
EXIT = "exit"
# A node's first word on its link: its name, so that the master can name a node it loses.
JOIN = "join"
# The master's last word when it leaves with its job ended: its link closing is then no loss.
BYE = "bye"
# A node's last line of the job: "line NAME TEXT".
LINE = "line"
# How often, at most, a node says its line and the master hands the lines on: about a second
# behind the job each, for a fraction of a core's time.
LINE_EVERY = 1.0
# A node's use now, from its last sample: "use NAME UTIL CELL", UTIL its GPUs' mean utilization
# (an integer, "-" without GPUs) and CELL the sample as a table shows it (_use.point_cell).
USE = "use"
# A node whose GPUs sit below IDLE % while another node's are at WORKING % or more, for this
# long (three samples at the default interval), is named in the live view: a straggler or a
# stuck rank.
IDLE_AFTER = 15.0
# How often a node looks whether its node log grew (a stat).
LINE_LOOK = 0.25
# The longest word a link reads at once (_Link.lines): a longer one would arrive in pieces.
WORD_BYTES = 256


def line_word(name, text):
    """The word that says node `name`'s last line `text`, cut to fit one read of the link (its
    newline included), never inside a character."""
    word = f"{LINE} {name} {' '.join(str(text).split())}".encode(errors="replace")
    return word[:WORD_BYTES - 1].decode(errors="ignore")


def line_heard(name, text):
    """`text` as the master hears it from node `name` (line_word's cut): the master's own line
    is kept the same way."""
    return line_word(name, text)[len(LINE) + len(name) + 2:]


class _Follow:
    """A node's last line of the job, looked for every LINE_LOOK s in its node log (read again
    only where the log changed), said through `tell(text)` until `ended` is set; and where
    `use` (the cell of the node's last sample, from its record) and `tell_use` are given, that
    cell through `tell_use(cell)` every LINE_EVERY s."""

    def __init__(self, log, tell, ended, use=None, tell_use=None):
        self.log, self.tell, self.ended = log, tell, ended
        self.use, self.tell_use, self.use_at = use, tell_use, 0.0
        self.seen = None
        self.latest = ""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def look(self):
        """The node log's job line now (read again only where the log changed)."""
        try:
            found = os.stat(self.log)
            seen = (found.st_size, found.st_mtime_ns)
        except OSError:
            seen = None
        if seen is not None and seen != self.seen:
            self.seen = seen
            self.latest = job_line(self.log)
        return self.latest

    def _run(self):
        while not self.ended.is_set():
            # Told every look, also unchanged: a line held back by the pace goes out in time.
            self.tell(self.look())
            if self.use is not None and time.monotonic() - self.use_at >= LINE_EVERY:
                self.use_at = time.monotonic()
                try:
                    cell = self.use()
                except (OSError, ValueError, LookupError, TypeError):
                    cell = ""
                if cell:
                    self.tell_use(" ".join(str(cell).split())[:80])
            self.ended.wait(LINE_LOOK)


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

    def __init__(self, sock, expect, window, stop, elastic=False, formed=None, lines=None):
        self.sock, self.expect, self.stop, self.elastic = sock, expect, stop, elastic
        self.formed = formed
        # Every node's last line as the master heard it: name -> {"last_line", "at"} (this
        # node's clock), handed to `lines(nodes)` at most every LINE_EVERY s (see follow).
        self.nodes = {}
        self.publish = lines
        self.heard = threading.Event()
        self.ended = threading.Event()
        self.publisher = None
        self.follower = None
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
            elif words[:1] == [LINE] and len(words) >= 2:
                self.line(words[1], line.split(None, 2)[2] if len(words) > 2 else "")
            elif words[:1] == [USE] and len(words) > 2:
                self.use(words[1], line.split(None, 2)[2])
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

    def line(self, name, text):
        """Node `name`'s last line, as it said it (the publisher hands it on)."""
        with self.lock:
            if not text or (self.nodes.get(name) or {}).get("last_line") == text:
                return
            self.nodes[name] = dict(self.nodes.get(name) or {}, last_line=text, at=time.time())
        self.heard.set()

    def use(self, name, said):
        """Node `name`'s use now, as it said it ("UTIL CELL"): its cell, and where its GPUs sit
        idle while another node's work, since when (`idle_since`, this node's clock; handed on
        once that lasted IDLE_AFTER s)."""
        util, _sep, cell = str(said).partition(" ")
        with self.lock:
            entry = dict(self.nodes.get(name) or {"last_line": "", "at": None}, use=cell)
            entry["gpu_util"] = int(util) if util.isdigit() else None
            self.nodes[name] = entry
            self._idle(time.time())
        self.heard.set()

    def _idle(self, now):
        """Each node's idle spell where its GPUs sit idle while another node's work (the lock
        held)."""
        utils = {name: said.get("gpu_util") for name, said in self.nodes.items()}
        for name, said in self.nodes.items():
            others = [u for n, u in utils.items() if n != name and u is not None]
            mine = utils[name]
            if mine is not None and mine < IDLE and any(u >= WORKING for u in others):
                said["idle_since"] = said.get("idle_since") or now
                said["idle_for"] = round(now - said["idle_since"], 1)
            else:
                said.pop("idle_since", None)
                said.pop("idle_for", None)

    def follow(self, log, name, use=None):
        """This node's own last line too, from its node `log` (and its use: `use()`, the cell of
        its last sample), and every node's handed on to `lines` (the constructor's) until
        own_exit; without `lines`, nothing."""
        if self.publish is None:
            return
        self.follower = _Follow(log, lambda text: self.line(name, line_heard(name, text)),
                                self.ended, use, lambda cell: self.use(name, cell))
        self.publisher = threading.Thread(target=self._publish, daemon=True)
        self.publisher.start()

    def _publish(self):
        while not self.ended.is_set():
            # Also now and then without news: an idle spell grows while nobody says a word.
            self.heard.wait(IDLE_AFTER / 3)
            self.heard.clear()
            self._hand_on()
            self.ended.wait(LINE_EVERY)

    def _hand_on(self):
        """Every node's line as heard now, to `lines`, where any node said one; a node idle
        for less than IDLE_AFTER s is not named yet."""
        with self.lock:
            self._idle(time.time())
            nodes = {name: {k: v for k, v in said.items()
                            if k != "idle_for" or v >= IDLE_AFTER}
                     for name, said in self.nodes.items()}
        if not nodes:
            return  # no node said a line: the record has none to keep
        try:
            self.publish(nodes)
        except OSError:
            pass  # a record not written now is written with the next line

    def _last_lines(self, name):
        """The lines as the job left them, handed on once more: this node's last look, and the
        last words of the nodes whose links closed."""
        if self.follower is None:
            return
        self.line(name, line_heard(name, self.follower.look()))
        self.ended.set()
        self.heard.set()
        self.publisher.join(LINE_EVERY + 5)
        self._hand_on()

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
        self._last_lines(name)
        for link in self.links:
            link.say(BYE)
            link.close()


class Member:
    """Another node's side: its link to the master. `stop(why)` ends this node's job when the
    master says so, or (static) when the master is gone."""

    def __init__(self, host, port, source, timeout, stop, name, elastic=False):
        self.stop, self.name, self.elastic = stop, name, elastic
        self.done = threading.Event()
        self.ended = threading.Event()  # the launcher's end: no more lines
        self.link = None
        self.error = None
        self.follower = None
        self.said_line, self.said_at = None, 0.0
        self.said_use = None
        self.line_lock = threading.Lock()
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

    def follow(self, log, use=None):
        """Say this node's last line of the job, from its node `log`, and its use (`use()`, the
        cell of its last sample, where it changed), until own_exit."""
        if self.link is not None:
            self.follower = _Follow(log, self.line, self.ended, use, self.say_use)

    def say_use(self, cell):
        """Say `cell` as this node's use now, where it changed."""
        if self.link is not None and cell != self.said_use:
            self.said_use = cell
            self.link.say(f"{USE} {self.name} {cell}")

    def line(self, text, force=False):
        """Say `text` as this node's last line where it changed, at most once every
        LINE_EVERY s (`force`: now, as the launcher ends); whether it was said."""
        with self.line_lock:  # the follower's look and the end's last one
            now = time.monotonic()
            if self.link is None or not text or text == self.said_line or (
                    not force and now - self.said_at < LINE_EVERY):
                return False
            self.said_line, self.said_at = text, now
        return self.link.say(line_word(self.name, text))

    def worker_failed(self, code, name):
        """A worker here ended with `code` while the launcher still runs: the master hears of
        it now (and stops the others); a stop it sends back is not for this node."""
        self.done.set()
        if self.link is not None:
            self.link.say(f"{EXIT} {name} {code}")

    def own_exit(self, code):
        self.done.set()
        self.ended.set()
        if self.follower is not None:
            self.line(self.follower.look(), force=True)  # the job's last words, before its end
        if self.link is not None:
            self.link.say(f"{EXIT} {self.name} {code}")
            self.link.close()
