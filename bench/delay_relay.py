"""A TCP relay that adds a network's round trip to an SSH connection: an ssh ProxyCommand.

    ProxyCommand python3 -S bench/delay_relay.py --rtt-ms 20 --stats-dir DIR %h %p

Connects to HOST:PORT and copies bytes between it and stdin/stdout (ssh's side), holding every
chunk RTT/2 ms in each direction before passing it on, in order: a round trip through the relay
costs RTT ms more than without it (plus the relay's own microseconds). No bandwidth limit, no
loss: a link with latency only, which is what a launch's many small exchanges pay for. This
kernel has no netem (bench/README.md), so the delay sits on the SSH path, where every
Ansible task and every pdsh session passes.

Counters, when --stats-dir is given: one JSON file per relay process (one per TCP connection,
that is per SSH connection), DIR/<tag>.<pid>.json, rewritten at most every 50 ms while bytes
flow and when the connection ends. <tag> is $THBENCH_RELAY_TAG (the bench sets it per launch;
ssh, pdsh and Ansible's workers pass their environment down to the ProxyCommand). Fields:
bytes and chunks each way; `exchanges`, the number of times an answer (bytes from the server)
followed bytes from the client, a request-answer turn, each of which pays one RTT (keepalives
of an idle connection included); the relay's own CPU seconds; start and last activity times.

Standard library only, no argparse, so that `python3 -S` starts it in ~10 ms.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import resource
import selectors
import socket
import sys
import time

CHUNK = 65536
FLUSH_EVERY = 0.05


def usage() -> None:
    sys.stderr.write("usage: delay_relay.py [--rtt-ms MS] [--stats-dir DIR] HOST PORT\n")
    sys.exit(2)


def parse(argv: list[str]) -> tuple[float, str, str, int]:
    rtt, stats, rest = 0.0, "", []
    args = iter(argv)
    for arg in args:
        if arg == "--rtt-ms":
            rtt = float(next(args, "x") or "x")
        elif arg == "--stats-dir":
            stats = next(args, "")
        elif arg.startswith("-"):
            usage()
        else:
            rest.append(arg)
    if len(rest) != 2:
        usage()
    return rtt, stats, rest[0], int(rest[1])


class Stats:
    def __init__(self, directory: str, host: str, port: int, rtt: float) -> None:
        tag = os.environ.get("THBENCH_RELAY_TAG", "untagged").replace("/", "_")
        self.path = os.path.join(directory, f"{tag}.{os.getpid()}.json") if directory else ""
        self.data = {"tag": tag, "host": host, "port": port, "rtt_ms": rtt,
                     "start": time.time(), "last": time.time(), "bytes_up": 0, "bytes_down": 0,
                     "chunks_up": 0, "chunks_down": 0, "exchanges": 0, "cpu_s": 0.0,
                     "closed": False}
        self.last_dir = ""  # direction of the previous chunk: "up" (client->server) or "down"
        self.dirty, self.flushed = True, 0.0

    def chunk(self, direction: str, size: int) -> None:
        d = self.data
        d[f"bytes_{direction}"] += size
        d[f"chunks_{direction}"] += 1
        if direction == "down" and self.last_dir == "up":
            d["exchanges"] += 1
        self.last_dir = direction
        d["last"] = time.time()
        self.dirty = True

    def flush(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.path or not self.dirty or (not force and now - self.flushed < FLUSH_EVERY):
            return
        ru = resource.getrusage(resource.RUSAGE_SELF)
        self.data["cpu_s"] = round(ru.ru_utime + ru.ru_stime, 4)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as handle:
            handle.write(json.dumps(self.data))
        os.replace(tmp, self.path)
        self.dirty, self.flushed = False, now

    def due(self) -> float | None:
        """Seconds until a pending flush is allowed, None when nothing to write."""
        if not self.path or not self.dirty:
            return None
        return max(0.0, FLUSH_EVERY - (time.monotonic() - self.flushed))


def relay(rtt_ms: float, stats: Stats, host: str, port: int) -> int:
    hold = rtt_ms / 2000.0  # seconds each way
    sock = socket.create_connection((host, port), timeout=30)
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    os.set_blocking(stdin, False)
    os.set_blocking(stdout, False)
    # [due time, bytes] per direction; passed on in order, each once its time has come. All
    # fds are non-blocking: a peer that does not read never stalls the other direction.
    queues = {"up": collections.deque(), "down": collections.deque()}
    writers = {"up": sock.send, "down": lambda data: os.write(stdout, data)}
    eof = {"up": False, "down": False}
    up_shut = False
    # select(2): its timeout has microseconds (epoll and poll round up to a millisecond, which
    # would make a 1 ms round trip 2 ms); three fds only.
    sel = selectors.SelectSelector()
    sel.register(stdin, selectors.EVENT_READ, ("read", "up"))
    sel.register(sock, selectors.EVENT_READ, ("read", "down"))
    sel.register(stdout, selectors.EVENT_WRITE, ("write", "down"))
    stdout_watched = True
    while True:
        now = time.monotonic()
        blocked = {"up": False, "down": False}
        for direction, queue in queues.items():
            while queue and queue[0][0] <= now:
                data = queue[0][1]
                try:
                    sent = writers[direction](data)
                except (BlockingIOError, InterruptedError):
                    blocked[direction] = True
                    break
                if sent < len(data):
                    queue[0][1] = data[sent:]
                    blocked[direction] = True
                    break
                queue.popleft()
        if eof["up"] and not queues["up"] and not up_shut:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            up_shut = True
        if eof["down"] and not queues["down"]:
            break
        stats.flush()
        waits = [q[0][0] - now for d, q in queues.items() if q and not blocked[d]]
        flush_in = stats.due()
        if flush_in is not None:
            waits.append(flush_in)
        if blocked["down"] != stdout_watched:
            if blocked["down"]:
                sel.register(stdout, selectors.EVENT_WRITE, ("write", "down"))
            else:
                sel.unregister(stdout)
            stdout_watched = blocked["down"]
        sock_events = (0 if eof["down"] else selectors.EVENT_READ) | \
            (selectors.EVENT_WRITE if blocked["up"] else 0)
        _watch(sel, sock, sock_events)
        if blocked["up"] or blocked["down"]:
            waits.append(0.05)  # a writable fd wakes the select; this is a backstop
        timeout = max(0.0, min(waits)) if waits else None
        for key, events in sel.select(timeout):
            kind, direction = key.data
            if kind == "write" or not events & selectors.EVENT_READ:
                continue  # writable: the next round writes
            try:
                data = os.read(stdin, CHUNK) if direction == "up" else sock.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                continue
            except ConnectionError:
                data = b""
            if not data:
                eof[direction] = True
                if direction == "up":
                    sel.unregister(stdin)
                continue
            stats.chunk(direction, len(data))
            queues[direction].append([time.monotonic() + hold, data])
    stats.data["closed"] = True
    stats.dirty = True
    stats.flush(force=True)
    sock.close()
    return 0


def _watch(sel: selectors.BaseSelector, sock: socket.socket, events: int) -> None:
    """The socket's registration: read until its EOF, write while a chunk waits for room."""
    registered = sock in sel.get_map() and sel.get_key(sock).events
    if events == (registered or 0):
        return
    if not events:
        sel.unregister(sock)
    elif registered:
        sel.modify(sock, events, ("read", "down"))
    else:
        sel.register(sock, events, ("read", "down"))


def main() -> int:
    rtt, directory, host, port = parse(sys.argv[1:])
    stats = Stats(directory, host, port, rtt)
    try:
        return relay(rtt, stats, host, port)
    except (BrokenPipeError, ConnectionError, OSError) as exc:
        stats.data["error"] = repr(exc)[:200]
        stats.data["closed"] = True
        stats.dirty = True
        stats.flush(force=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
