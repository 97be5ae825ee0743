# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The interconnect check: all-reduce bus bandwidth and latency across the job's nodes with the
job's own backend (gloo on CPU, NCCL on GPU), and pairwise exchanges between the nodes that
narrow a slow result down to a node or a link. torch only: no MPI, no nccl-tests build.

Two halves in one file, so that the schedule the nodes run and the one the judge reads can
never disagree:
- `measure` runs in the job's interpreter, one process per rank (the interconnect module passes
  this file's source to `python -c`), so this file imports nothing but the standard library at
  its top, and torch inside `measure`; it runs on Python 3.8.
- `run` starts this node's ranks and waits for them (the interconnect module calls it).
- `rounds`, `bus_factor` and `judge` are pure; the gate calls `judge` on the controller.

Units: bandwidth in GB/s (1e9 bytes per second), as nccl-tests prints it; link speeds as the
kernel reports them (/sys/class/net/<if>/speed, Mb/s).
"""

from __future__ import annotations

import inspect
import json
import os
import statistics
import subprocess
import sys
import time


def rounds(count):
    """The round-robin schedule of pairwise exchanges between `count` nodes: each round is a
    list of (a, b) pairs in which every node takes part at most once, and after all rounds
    every pair has met once (the circle method: count - 1 rounds, count when it is odd)."""
    slots = list(range(count)) + ([None] if count % 2 else [])
    half = len(slots) // 2
    schedule = []
    for _round in range(len(slots) - 1):
        pairs = [(slots[i], slots[-1 - i]) for i in range(half)]
        schedule.append(sorted(tuple(sorted(p)) for p in pairs if None not in p))
        slots = [slots[0], slots[-1]] + slots[1:-1]
    return schedule


def bus_factor(world_size):
    """What turns an all-reduce's algorithm bandwidth into bus bandwidth: 2(n-1)/n, the share of
    the data every rank sends and receives in a ring all-reduce (nccl-tests' definition)."""
    return 2.0 * (world_size - 1) / world_size if world_size > 1 else 0.0


def _timed(step, sync, iterations, stop=None):
    """Median seconds of `step` over `iterations` runs after one warm-up; `stop`, asked after
    each run, may end it early (it must answer the same on every rank taking part)."""
    step()
    sync()
    times = []
    for _iteration in range(iterations):
        begin = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - begin)
        if stop is not None and stop():
            break
    return statistics.median(times), len(times)


def measure(spec):  # pragma: no cover - runs in the job's interpreter, tested through it
    """One rank's part of the check; returns what this rank measured."""
    import datetime

    import torch
    import torch.distributed as dist

    rank, world = spec["rank"], spec["world_size"]
    leaders = spec["leaders"]  # global rank of each node's first process, in node order
    node = spec["node_rank"]
    device = "cpu"
    if spec["backend"] == "nccl":
        torch.cuda.set_device(spec["local_rank"])
        device = f"cuda:{spec['local_rank']}"
    dist.init_process_group(spec["backend"], init_method=f"tcp://{spec['master']}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec["timeout"]))
    try:
        def sync():
            if device != "cpu":
                torch.cuda.synchronize()

        # A slow link must not make the check take minutes: once `budget` seconds have passed
        # rank 0 calls the all-reduces off, and every rank learns it from the same collective,
        # so that all run the same number whatever their own clocks say.
        def over_budget(begun):
            flag = torch.zeros(1, device=device)
            flag.fill_(1.0 if rank == 0 and time.monotonic() - begun > spec["budget"] else 0.0)
            dist.all_reduce(flag)
            return flag.item() > 0

        def agreed(iterations, step):
            begun = time.monotonic()
            return _timed(step, sync, iterations, lambda: over_budget(begun))

        small = torch.ones(1, device=device)
        latency, _n = agreed(spec["latency_iterations"], lambda: dist.all_reduce(small))
        big = torch.ones(max(1, spec["bytes"] // 4), device=device)
        seconds, done = agreed(spec["iterations"], lambda: dist.all_reduce(big))
        nbytes = big.numel() * big.element_size()
        algbw = nbytes / seconds / 1e9
        result = {"rank": rank, "node_rank": node, "world_size": world,
                  "latency_us": round(latency * 1e6, 1), "bytes": nbytes,
                  "seconds": seconds, "iterations": done, "algbw": round(algbw, 4),
                  "busbw": round(algbw * bus_factor(world), 4), "pairs": []}

        # Pairwise: every pair of nodes exchanges in both directions at once, between their
        # first processes, in rounds where each node meets one other (the others wait at the
        # barrier). A node whose own link is slow is slow with every peer; a bad link between
        # two is slow with one.
        out = torch.ones(max(1, spec["pair_bytes"] // 4), device=device)
        back = torch.empty_like(out)
        pair_bytes = out.numel() * out.element_size()
        for schedule in rounds(len(leaders)) if spec["pairs"] else ():
            dist.barrier()
            peer = next((b if a == node else a for a, b in schedule if node in (a, b)), None)
            if peer is None or rank != leaders[node]:
                continue
            other = leaders[peer]

            def exchange(other=other):
                ops = [dist.P2POp(dist.isend, out, other), dist.P2POp(dist.irecv, back, other)]
                for work in dist.batch_isend_irecv(ops):
                    work.wait()

            # A fixed count: the two ends must run the same number of exchanges.
            took, _n = _timed(exchange, sync, spec["pair_iterations"])
            result["pairs"].append({"peer": peer, "bytes": pair_bytes, "seconds": took,
                                    "gbps": round(pair_bytes / took / 1e9, 4)})
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def _main():  # pragma: no cover - the entry point of `python -c`
    spec = json.loads(sys.argv[1])
    try:
        out = measure(spec)
    except Exception as exc:  # pylint: disable=broad-except  # reported, not raised
        out = {"rank": spec.get("rank"), "error": f"{type(exc).__name__}: {exc}"[:2000]}
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.stdout.flush()


def run(p):
    """Starts this node's ranks (the interconnect module's parameters p) and waits for them;
    the result of its first rank."""
    procs = p["node_procs"]
    first = sum(procs[:p["node_rank"]])
    leaders = [sum(procs[:i]) for i in range(len(procs))]
    # This file's own source: each rank runs it with the job interpreter.
    source = inspect.getsource(sys.modules[__name__])
    env = dict(os.environ)
    for key in [k for k in env if k.startswith("ANSIBLE_")]:
        del env[key]
    if p["interface"]:
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = p["interface"]
    started = time.monotonic()
    children = []
    for local in range(procs[p["node_rank"]]):
        spec = {"rank": first + local, "local_rank": local, "world_size": sum(procs),
                "node_rank": p["node_rank"], "leaders": leaders, "backend": p["backend"],
                "master": f"{p['master_addr']}:{p['master_port']}", "timeout": p["timeout"],
                "bytes": p["bytes"], "iterations": p["iterations"],
                "latency_iterations": p["latency_iterations"], "budget": p["budget"],
                "pairs": p["pairs"], "pair_bytes": p["pair_bytes"],
                "pair_iterations": p["pair_iterations"]}
        children.append(subprocess.Popen(
            [p["python"] or sys.executable, "-c", source, json.dumps(spec)], env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    answers = []
    deadline = started + 2 * p["timeout"]
    for child in children:
        try:
            out, err = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            answers.append({"error": f"no result within {2 * p['timeout']:g} s (a peer that "
                                     f"never joined, or a collective that never completed)"})
            continue
        answers.append(_answer(out, err, child.returncode))
    result = {"allreduce": None, "pairs": [], "error": None,
              "seconds": round(time.monotonic() - started, 3)}
    errors = [f"rank {first + i}: {a['error']}" for i, a in enumerate(answers) if a.get("error")]
    if errors:
        result["error"] = "; ".join(errors)
        return result
    mine = answers[0]
    result["allreduce"] = {k: mine[k] for k in
                           ("busbw", "algbw", "latency_us", "bytes", "iterations", "world_size")}
    result["pairs"] = mine["pairs"]
    return result


def _answer(out, err, code):
    """One rank's JSON line, or its error from what it printed."""
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        lines = [ln for ln in (err or "").strip().splitlines() if ln.strip()]
        return {"error": (lines[-1] if lines else f"exit code {code}")[:2000]}


def judge(hosts, results, min_busbw=0.0, min_link_share=0.0, link_speeds=None):
    """The verdict on one check: figures, pass or fail, and the problems naming node or link.

    hosts: the nodes in node-rank order. results: host -> its measure (the module's result:
    `allreduce` with busbw, algbw, latency_us, bytes, world_size; `pairs` of {peer (node index),
    gbps}; or `error`). link_speeds: host -> Mb/s of the interface its job traffic uses, where
    known. The threshold is the higher of `min_busbw` (GB/s) and `min_link_share` of the slowest
    link; with neither, the figures are kept and nothing fails.
    Problems are (host, check, expected, found, fix) tuples, as the gate writes them."""
    speeds = {h: s for h, s in (link_speeds or {}).items() if isinstance(s, (int, float)) and s > 0}
    threshold, why = float(min_busbw or 0), f"{min_busbw:g} GB/s set for the job"
    if min_link_share and len(speeds) == len(hosts):
        slowest = min(speeds, key=speeds.get)
        by_share = min_link_share * speeds[slowest] / 8000.0
        if by_share > threshold:
            threshold = by_share
            why = (f"{min_link_share:g} of {speeds[slowest]:g} Mb/s, the slowest link "
                   f"({slowest})")
    problems = []
    for host in hosts:
        mine = results.get(host) or {}
        error = mine.get("error") or (None if mine.get("allreduce") else "no result")
        if error:
            problems.append((host, "interconnect", "the node to take part in an all-reduce with "
                             "every other node of the job", error,
                             "check that the node reaches the master address and its peers on "
                             "any TCP port (the job's firewall), and that the job's Python "
                             "imports torch with the job's backend"))
    verdict = {"ok": not problems, "threshold_gbps": round(threshold, 4) or None,
               "threshold_why": why if threshold else None, "problems": problems,
               "allreduce": None, "pairs": [], "slow_nodes": [], "slow_links": []}
    if problems:
        return verdict
    first = results[hosts[0]]["allreduce"]
    verdict["allreduce"] = {k: first.get(k) for k in
                            ("busbw", "algbw", "latency_us", "bytes", "world_size", "iterations")}
    pairs = _pairs(hosts, results)
    verdict["pairs"] = [{"a": a, "b": b, "gbps": g} for (a, b), g in sorted(pairs.items())]
    if not threshold or first["busbw"] >= threshold or len(hosts) < 2:
        return verdict
    verdict["ok"] = False
    slow = {p: g for p, g in pairs.items() if g < threshold}
    if not slow and pairs:
        # Every pair alone is fast enough: name the pairs far below the best (the slowest
        # part of a ring is what every rank waits for).
        best = max(pairs.values())
        slow = {p: g for p, g in pairs.items() if g < best / 2}
    nodes = [h for h in hosts if len(hosts) > 2 and all(
        p in slow for p in pairs if h in p)]
    links = [p for p in sorted(slow) if not set(p) & set(nodes)]
    verdict["slow_nodes"], verdict["slow_links"] = nodes, [list(p) for p in links]
    expected = f"all-reduce bus bandwidth >= {threshold:.3g} GB/s ({why})"
    measured = (f"{first['busbw']:.3g} GB/s across {len(hosts)} nodes "
                f"({first['world_size']} ranks, {first['bytes'] >> 20} MiB)")
    for host in nodes:
        mine = ", ".join(f"{(set(p) - {host}).pop()} {g:.3g} GB/s"
                         for p, g in sorted(pairs.items()) if host in p)
        fast = [g for p, g in pairs.items() if host not in p]
        problems.append((host, "interconnect", expected,
                         f"{measured}; this node is slow with every peer ({mine})"
                         + (f", the others reach {min(fast):.3g} GB/s or more" if fast else ""),
                         f"check {host}'s link: its interface's speed and errors (ethtool, ip -s "
                         f"link), a traffic shaper (tc qdisc show), its cable and switch port; "
                         f"or leave {host} out of the inventory"))
    for a, b in links:
        problems.append((f"{a} <-> {b}", "interconnect", expected,
                         f"{measured}; {a} and {b} exchange at {pairs[(a, b)]:.3g} GB/s",
                         f"check the path between {a} and {b} (their interfaces, the switches "
                         f"between them, a traffic shaper on either: tc qdisc show)"
                         + ("; with two nodes the slow one cannot be told apart: measure "
                            "with a third node" if len(hosts) == 2 else "")))
    if not nodes and not links:
        problems.append((", ".join(hosts), "interconnect", expected,
                         f"{measured}, while every pair alone is fast",
                         "look for contention: another job on the links, a shared uplink, or "
                         "a switch between the nodes"))
    return verdict


def _pairs(hosts, results):
    """(host a, host b) -> GB/s of their exchange, the lower of what both ends measured."""
    pairs = {}
    for host in hosts:
        for pair in results[host].get("pairs") or []:
            peer = hosts[pair["peer"]]
            key = tuple(sorted((host, peer), key=hosts.index))
            pairs[key] = min(pairs.get(key, pair["gbps"]), pair["gbps"])
    return pairs


if __name__ == "__main__":  # pragma: no cover
    _main()
