"""What the start barrier's pairs cost: N nodes, each a process of its own on this machine at
its own loopback address (127.0.0.1 is the master), meet at the real barrier (_probe.barrier)
as they do in a launch, with the pairs and without them (the master names no peers: the
barrier as it was before the pairs).

    .venv/bin/python bench/barrier_pairs.py [--sizes 8,32] [--reps 5]

Per size, the medians over --reps of: the barrier's wall time on the master (from its listen
to its word), the pairs' share of it on the master (naming the peers to collecting every
report), and one node's own connections to its peers (check_peers). Loopback has no wire: the
figures are the CPU and the kernel's work, the floor of a real network's cost; every node here
shares this machine's cores, a real node has its own. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "collection"))

from ansible_collections.torchherd.cluster.plugins.module_utils import _probe  # noqa: E402


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _node(index, count, port, pairs, out) -> None:
    timed = {}
    if not pairs:
        _probe.Listener.prove_pairs = lambda self, timeout: []
    real_check, real_prove = _probe.check_peers, _probe.Listener.prove_pairs

    def check_peers(*args):
        began = time.monotonic()
        try:
            return real_check(*args)
        finally:
            timed["check"] = time.monotonic() - began

    def prove_pairs(self, timeout):
        began = time.monotonic()
        try:
            return real_prove(self, timeout)
        finally:
            timed["prove"] = time.monotonic() - began

    _probe.check_peers, _probe.Listener.prove_pairs = check_peers, prove_pairs
    began = time.monotonic()
    result = _probe.barrier("127.0.0.1", port, "bench", 3, 30, listen=index == 0, expect=count,
                            source=f"127.0.0.{index + 1}", name=f"node{index}")
    out.put((index, result["go"], time.monotonic() - began, timed))


def one(count: int, pairs: bool) -> dict:
    port = _free_port()
    out = multiprocessing.Queue()
    master = multiprocessing.Process(target=_node, args=(0, count, port, pairs, out))
    master.start()
    time.sleep(0.2)  # the master listens first: its wall time is then the barrier's own
    nodes = [multiprocessing.Process(target=_node, args=(i, count, port, pairs, out))
             for i in range(1, count)]
    for proc in nodes:
        proc.start()
    results = {}
    for _ in range(count):
        index, go, seconds, timed = out.get(timeout=120)
        results[index] = (go, seconds, timed)
    for proc in [master, *nodes]:
        proc.join(10)
    assert all(go for go, _s, _t in results.values()), results
    return {"wall": results[0][1], "prove": results[0][2].get("prove", 0.0),
            "check": statistics.median(t.get("check", 0.0) for _g, _s, t in results.values())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="8,32")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    multiprocessing.set_start_method("fork")
    print("| nodes | barrier without pairs (s) | barrier with pairs (s) | pairs on the master (s) "
          "| one node's connections to its peers (ms) |")
    print("|---|---|---|---|---|")
    for count in (int(n) for n in args.sizes.split(",")):
        without = [one(count, False) for _ in range(args.reps)]
        with_pairs = [one(count, True) for _ in range(args.reps)]
        print(f"| {count} | {statistics.median(r['wall'] for r in without):.3f} "
              f"| {statistics.median(r['wall'] for r in with_pairs):.3f} "
              f"| {statistics.median(r['prove'] for r in with_pairs):.3f} "
              f"| {1000 * statistics.median(r['check'] for r in with_pairs):.1f} |")


if __name__ == "__main__":
    main()
