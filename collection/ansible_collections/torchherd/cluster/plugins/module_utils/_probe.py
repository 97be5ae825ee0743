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
and not as a hang at init.

All pairs, in the barrier: gloo and NCCL connect every rank to every other, not only to the
master. Once every node came and was reached back, the master tells each node every node's
port (the same kernel-picked port at its job interface's address, open to the master already),
each connects to all the others at once and reports the ones it could not reach, and the master
says go only where none failed. It costs a node one connection per peer, in parallel, in the
barrier's own round trips (see pair_seconds).

A node's back port is _probeback's, what the barrier says of failed pairs _probeproblems',
and the master port is bound as _ports binds it."""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.torchherd.cluster.plugins.module_utils._ports import bind
from ansible_collections.torchherd.cluster.plugins.module_utils._probeback import (
    BACK,
    REFUSE,
    back_error,
    offer_back,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._probeproblems import (
    REFUSED,
    called_off,
    pair_problem,
    problem,
    refused_problem,
)

GO = "go"
ABORT = "abort"
PEERS = "peers"
PAIRS = "pairs"
# Connections a node opens at once to its peers: every one of them where there are up to this
# many, in rounds beyond.
PARALLEL = 64
# What a line of the pairs' exchange may carry (a list of every node, or of failed pairs).
LONG_LINE = 1 << 20
# The failed pairs the master names with its abort: a node shut to all is N - 1 of them.
MOST_PAIRS = 100


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
        # With `hold`, every node that named its way back: name, address, port (None where it
        # could not listen there) and its connection, for the pairs (prove_pairs).
        self.entries = []
        # The names of the nodes that said they will not start (REFUSE).
        self.refused = []
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
        port = int(words[1]) if len(words) >= 2 and words[0] == BACK and words[1].isdigit() \
            else None
        refuses = len(words) >= 4 and words[0] == BACK and words[3] == REFUSE
        name = words[2] if len(words) > 2 and words[2] != "-" else address
        # A probe that offers no way back has nothing to check.
        error = connect_back(address, port, self.token, self.timeout) if port is not None \
            else None
        with self._lock:
            self.back[address] = error
            if refuses:
                self.refused.append(name)
            if self.hold:
                self.held.append(conn)
                if len(words) >= 2 and words[0] == BACK:
                    self.entries.append({"name": name, "address": address, "port": port,
                                         "conn": conn})
                return
        conn.close()

    def back_failed(self):
        """Address -> error of every node the master could not connect back to."""
        return {address: error for address, error in self.back.items() if error}

    def prove_pairs(self, timeout):
        """Tells every held node every node's port and collects the pairs each could not
        connect; the problems (pair_problem), empty where every pair connected."""
        targets = [[e["name"], e["address"], e["port"]] for e in self.entries
                   if e["port"] is not None]
        if len(targets) < 2:
            return []
        said = f"{PEERS} {json.dumps(targets)}\n".encode()
        for entry in self.entries:
            try:
                entry["conn"].sendall(said)
            except OSError:
                pass  # its report does not come: named below
        # Every node connects at once, so the reports come at about the same time: one
        # deadline for all of them.
        seconds = pair_seconds(len(targets), timeout)
        deadline = time.monotonic() + seconds
        problems = []
        for entry in self.entries:
            try:
                line = _read_line(entry["conn"], max(0.05, deadline - time.monotonic()),
                                  LONG_LINE)
            except OSError:
                line = ""
            head, _sep, rest = line.partition(" ")
            try:
                failed = json.loads(rest) if head == PAIRS else None
            except ValueError:
                failed = None
            if not isinstance(failed, list):
                problems.append(problem(
                    entry["name"], "peers reachable",
                    f"{entry['name']} to report within {seconds:g} s which of the job's other "
                    f"nodes it could open a TCP connection to",
                    "no report (the node's barrier ended, or its connection to the master "
                    "broke)",
                    f"see the node log of {entry['name']}, and launch again"))
                continue
            for peer, address, port, error in failed:
                problems.append(pair_problem(entry["name"], entry["address"], peer, address,
                                             port, error))
        return problems

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


def _read_line(conn, timeout, limit=256):
    """One line from a socket without buffering past it (the master's word comes later)."""
    conn.settimeout(timeout)
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = conn.recv(1)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def connect_back(address, port, token, timeout, source=None):
    """The master's connection to a node's back port (and a peer's, from its own address
    `source`): None, or why it failed."""
    try:
        with socket.create_connection((address, port), timeout=timeout,
                                      source_address=(source, 0) if source else None) as sock:
            answer = _read_line(sock, timeout)
    except socket.timeout:
        return f"timed out after {timeout:g} s (dropped: a firewall on the node?)"
    except ConnectionRefusedError:
        return "connection refused (rejected: a firewall on the node?)"
    except OSError as exc:
        if source and exc.errno == errno.EADDRNOTAVAIL:
            return f"{source} is not an address of this node"
        return "no route to host" if exc.errno == errno.EHOSTUNREACH \
            else (exc.strerror or str(exc))
    return None if answer.encode() + b"\n" == token else f"something else answered: {answer!r}"


class _Lines:
    """Lines from a connected socket, one at a time: the token and the master's word may
    arrive in one segment when a node reads late."""

    def __init__(self, sock):
        self.sock = sock
        self.reader = sock.makefile("rb")

    def line(self, timeout, limit=256):
        self.sock.settimeout(timeout)
        return self.reader.readline(limit).decode(errors="replace").strip()

    def close(self):
        self.reader.close()
        self.sock.close()


def connect(host, port, token, timeout, window, keep=False, source=None, unanswered=False):
    """(reachable, error, socket or None). A refused connection is tried again until `window`
    seconds have passed: the master may start listening a moment after a node first tries.
    With `unanswered` (the start's barrier), so is one that `timeout` seconds left unanswered:
    where every node opens its own firewall rules in its start, the master's may come a moment
    after this node's first try, and until then the master's firewall drops it. With `keep`, the
    connection stays open for wait_word(). With `source`, it leaves from that local address:
    the master's answer must then come back to it, which proves the path the job's peers take
    to this node's interface."""
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
            if unanswered and time.monotonic() < deadline:
                continue
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


def wait_word(lines, seconds, peers=None):
    """The master's word on a kept connection, (GO, the gang port the master named with its
    go, or None) or (ABORT, the problems it named with its abort: a list, maybe empty); ABORT
    if it never comes. Where the master first names the peers, `peers` (this node's back port,
    its token and connect timeout) connects to them and the report goes back before the word."""
    try:
        while True:
            head, _sep, rest = lines.line(seconds, LONG_LINE).partition(" ")
            if head != PEERS:
                break
            failed = check_peers(json.loads(rest), *peers) if peers else []
            lines.sock.sendall(f"{PAIRS} {json.dumps(failed)}\n".encode())
    except (OSError, ValueError):
        head, rest = ABORT, ""
    finally:
        lines.close()
    if head == GO:
        return GO, int(rest) if rest.isdigit() else None
    try:
        problems = json.loads(rest) if rest else []
    except ValueError:
        problems = []
    return ABORT, problems if isinstance(problems, list) else []


def pair_seconds(count, timeout):
    """At most how long `count` nodes take to connect every pair: a round of PARALLEL
    connections per node, each `timeout` to connect and `timeout` for the token, and a second
    for the reports."""
    rounds = -(-max(count - 1, 0) // PARALLEL)
    return rounds * 2 * timeout + 1


def check_peers(peers, back, token, timeout):
    """[peer's name, address, port, error] of every peer (name, address, port) this node
    could not open a connection to, from its own address: all at once, as gloo and NCCL
    connect every rank to every other at init."""
    own = (back.address, back.port) if back is not None else None
    source = back.address if back is not None else None
    targets = [p for p in peers if own is None or (p[1], p[2]) != own]
    if not targets:
        return []
    said = token.encode() + b"\n"  # as the back ports answer it
    with ThreadPoolExecutor(max_workers=min(PARALLEL, len(targets))) as pool:
        errors = list(pool.map(
            lambda p: connect_back(p[1], p[2], said, timeout, source), targets))
    return [[p[0], p[1], p[2], e] for p, e in zip(targets, errors) if e]


def run_token(run_id):
    """What the listener answers for a run: names it, so that no other service passes."""
    return f"torchherd-{run_id}"


def probe(host, port, token, timeout, window, listen=False, expect=1, hold=False, source=None,
          name=None, refuse=False):
    """One node's part of the probe, run on every node at once: the master (`listen`) answers up
    to `expect` nodes for `window` seconds while every node, the master too, connects to
    host:port, retries a refused connection (with `hold`, an unanswered one too) for `window`
    seconds and waits `timeout` seconds for the handshake and the token, from the local address
    `source` where given. Then the master connects back to every node at the address it came
    from (see the module's doc).

    Returns (result, held). result: reachable, error, seconds (to connect and read the token),
    address (the local address the node connected from), back_error (why the master could not
    connect back to it, or None), and on the master listening, served and back_failed (address
    -> error). With `hold`, held is what the barrier decides on: (the master's Listener keeping
    the nodes' connections, for prove_pairs() and release(), or None on the other nodes; this
    node's kept connection, for wait_word(); its back port, still open for the peers); else
    None. `name` is how this node is named in the pairs' messages (its address without it);
    `refuse`: this node tells the master it will not start (see barrier)."""
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
    # Held (the start's barrier): the master's rules may open a moment after this node's.
    reachable, error, kept = connect(host, port, token, timeout, window, keep=True,
                                     source=source, unanswered=hold)
    result.update(reachable=reachable, error=error, seconds=round(time.monotonic() - started, 3))
    back = None
    if reachable:
        result["address"] = kept.sock.getsockname()[0]
        back = offer_back(kept.sock, token, _held_seconds(window, timeout, expect), name,
                          refuse=refuse)
    if listener is None and hold:
        return result, (None, kept, back)
    if kept is not None and not hold:
        kept.close()
    if listener is not None:
        # The other nodes are still connecting: answer them until all came or time is up.
        listener.join()
        result.update(served=listener.served, back_failed=listener.back_failed())
    if reachable:
        result["back_error"] = back_error(back, result["address"], timeout + 1, close=not hold)
    return result, (listener, kept, back) if hold else None


def _held_seconds(window, timeout, expect):
    """How long a node waits for the master's word: every node's coming, the connections
    back, the pairs."""
    return window + 2 * timeout + 5 + pair_seconds(expect, timeout)


def barrier(host, port, run_id, timeout, window, listen=False, expect=1, source=None,
            gang=None, name=None, refuse=None):
    """The probe as a start barrier: every node reaches the master port, the master reaches
    every node back, and every node reaches every other (the pairs), or none starts.

    The probe's result plus `go`: the master tells each node to go only once all `expect`
    nodes have come, it reached each of them back and no pair failed, and to abort otherwise.
    With `gang` (a listening socket, on the master) the go names its port, and every node's
    result has `gang_port`: the node-side gang (see _gang) meets there. Where pairs failed,
    every node's result has `pairs_failed` (the problems, at most MOST_PAIRS) and `error`
    names them. `name` names this node in those (see probe).

    With `refuse` (why, in a few words), this node comes as every node does but says it will
    not start: the master calls the start off on every node as soon as all came, and every
    node's result has `refused`, the names of the nodes that refused (REFUSED problems)."""
    token = run_token(run_id)
    result, held = probe(host, port, token, timeout, window, listen, expect, hold=True,
                         source=source, name=name, refuse=bool(refuse))
    listener, kept, back = held or (None, None, None)
    seconds = _held_seconds(window, timeout, expect)
    if listen:
        go = (result["reachable"] and result["served"] >= expect and not result["back_failed"]
              and not result["back_error"])
        # The master's own node answers the pairs as every node does, on its own connection.
        mine = threading.Thread(target=wait_word, args=(kept, seconds, (back, token, timeout)),
                                daemon=True) if kept is not None else None
        if mine is not None:
            mine.start()
        refusals = [refused_problem(who) for who in listener.refused] if listener else []
        failed = listener.prove_pairs(timeout)[:MOST_PAIRS] if go and not refusals else []
        failed = refusals + failed
        go = go and not failed
        if listener is not None:
            word = GO if not go or gang is None else f"{GO} {gang.getsockname()[1]}"
            listener.release(word if go else
                             f"{ABORT} {json.dumps(failed)}" if failed else ABORT)
        if mine is not None:
            mine.join(seconds)
        if back is not None:
            back.close()
        if failed:
            result.update(_called_off(failed))
        return dict(result, go=go, gang_port=gang.getsockname()[1] if gang else None)
    if not result["reachable"]:
        return dict(result, go=False)
    word, said = wait_word(kept, seconds, (back, token, timeout))
    go = word == GO
    result["gang_port"] = said if go else None
    # The master decided after its connections back: by now this node's was made or not.
    result["back_error"] = back_error(back, result["address"], 0.5)
    if not go and said:
        result.update(_called_off(said))
    elif not go and not result["back_error"]:
        result["error"] = (f"the start was called off: not every node reached {host}:{port} "
                           f"(and was reached back) within {window:g} s")
    return dict(result, go=go)


def _called_off(problems):
    """What a node's result says where the master named why it called the start off: the
    nodes that refused to start (`refused`, their names), the pairs that failed
    (`pairs_failed`), and `error`."""
    refused = [p["host"] for p in problems if p.get("check") == REFUSED]
    pairs = [p for p in problems if p.get("check") != REFUSED]
    said = {"error": called_off(problems)}
    if refused:
        said["refused"] = refused
    if pairs:
        said["pairs_failed"] = pairs
    return said
