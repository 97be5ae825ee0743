"""The interconnect check: how long it takes at 2, 4, 8 nodes, and what it adds to a launch.

    .venv/bin/python bench/interconnect.py [--sizes 2,4,8] [--reps 3]

For each size N brings up a container cluster icb<N> with a data network
(tests/cluster/testbed.py: every node has a second, internal network, the job's interface),
then, after one untimed warm-up launch (the code's first sync, cold caches), alternates,
--reps times, in one process (driver.api, blocking calls):

  v0  verify, interconnect never
  v1  verify, interconnect verify, interconnect_max_age 0 (a fresh measure)
  v2  verify, interconnect verify, interconnect_max_age default, right after v1 (reused)
  l0  launch, interconnect never
  l1  launch, interconnect always, interconnect_max_age 0 (a fresh measure before the start)

all on examples/allreduce.py, one process per node, one runs directory (the reused measure
lives in <runs_dir>/.interconnect). Per call: the wall time (time.monotonic around it); for
v1, v2, l1 what preflight.json's gate.interconnect says (bus bandwidth, latency, reused), the
module's own wall time per node (results[host].seconds, or the module's result in the
ansible-runner events where the gate does not keep it) and the Ansible task's duration.

Reports medians per size of the differences within a repetition: the check (v1 - v0), the
reuse (v2 - v0), the launch overhead (l1 - l0). Writes
bench/results/<UTC stamp>-interconnect.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import run as base  # noqa: E402  bench/run.py: ROOT on sys.path, log, machine, med, fmt

from driver import api  # noqa: E402
from tests.cluster import testbed  # noqa: E402

ROOT = base.ROOT
MEASURE_TASK = "Measure the interconnect"
CALLS = {
    # untimed, once per cluster: the first call pays for the code's first sync, the nodes'
    # cached torch probe and cold caches; not in the figures
    "warmup": ("launch", {"interconnect": "never"}),
    "v0": ("verify", {"interconnect": "never"}),
    "v1": ("verify", {"interconnect": "verify", "interconnect_max_age": 0}),
    "v2": ("verify", {"interconnect": "verify"}),
    "l0": ("launch", {"interconnect": "never"}),
    "l1": ("launch", {"interconnect": "always", "interconnect_max_age": 0}),
}

TIMED = [k for k in CALLS if k != "warmup"]


class Recorder:
    """ansible-runner events of one call: the interconnect module's result on every node, and
    task and play starts in `events` (the format bench/run.py's task_times reads)."""

    def __init__(self, events: Path) -> None:
        self.module: dict[str, dict] = {}
        self.events = events.open("w")

    def __call__(self, event: dict) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind in ("playbook_on_task_start", "playbook_on_play_start", "playbook_on_stats"):
            stamp = datetime.fromisoformat(event["created"]).timestamp() \
                if event.get("created") else time.time()
            name = data.get("task") or data.get("play") or ""
            self.events.write(json.dumps({"t": stamp, "event": kind, "name": name}) + "\n")
        if kind not in ("runner_on_ok", "runner_on_failed"):
            return
        if data.get("task") != MEASURE_TASK:
            return
        res = data.get("res") or {}
        self.module[data.get("host", "?")] = {"seconds": res.get("seconds"),
                                              "task_s": data.get("duration"),
                                              "error": res.get("error")}


def measure(key: str, cluster: testbed.Cluster, work: Path) -> dict:
    action, extra = CALLS[key]
    job = {"script": "allreduce.py", "code_src": str(work / "code"), "nproc_per_node": 1,
           **extra}
    events = work / f"events-{key}-{time.time():.0f}.jsonl"
    rec = Recorder(events)
    call = api.verify if action == "verify" else api.launch
    t0 = time.monotonic()
    result = call(job, cluster.inventory, runs_dir=work / "runs", on_event=rec)
    wall = time.monotonic() - t0
    rec.events.close()
    out = {"call": key, "ok": bool(result.ok), "wall_s": wall, "run_id": result.run_id,
           "reason": None if result.ok else result.reason}
    gate = (read_json(result.run_dir / "preflight.json") or {}).get("gate") or {}
    ic = gate.get("interconnect")
    if not result.ok:
        out["problems"] = gate.get("problems") or result.problems
    if ic:
        results = ic.get("results") or {}
        seconds = {h: r.get("seconds") for h, r in results.items()
                   if r.get("seconds") is not None}
        out["seconds_from"] = "preflight.json" if seconds else None
        if not seconds and not ic.get("reused"):  # the gate keeps no seconds: the events do
            seconds = {h: m["seconds"] for h, m in rec.module.items()
                       if m["seconds"] is not None}
            out["seconds_from"] = "events"
        ar = ic.get("allreduce") or {}
        out.update(ic_ok=ic.get("ok"), threshold_gbps=ic.get("threshold_gbps"),
                   reused=ic.get("reused"), busbw=ar.get("busbw"),
                   algbw=ar.get("algbw"), latency_us=ar.get("latency_us"),
                   bytes=ar.get("bytes"), pairs=ic.get("pairs"), node_seconds=seconds,
                   module_s=max(seconds.values()) if seconds else None,
                   task_s=max((m["task_s"] or 0 for m in rec.module.values()), default=None)
                   if rec.module else None)
    if result.timings:
        out["timings"] = result.timings
    out["tasks"] = base.task_times(events)
    return out


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_size(n: int, reps: int, work: Path) -> dict:
    name = f"icb{n}"
    runs: list[dict] = []
    with testbed.reserve(name):
        base.log(f"up {name} ({n} nodes, data network)")
        cluster = testbed.up(name, n, data_network=True)
        try:
            for rep in range(reps):
                for key in CALLS if rep == 0 else TIMED:
                    r = measure(key, cluster, work)
                    r.update(nodes=n, rep=rep)
                    runs.append(r)
                    base.log(f"n={n} rep={rep} {key}: {r['wall_s']:.2f} s ok={r['ok']}"
                             + (f" module {r['module_s']:.2f} s" if r.get("module_s") else "")
                             + (f" busbw {r['busbw']:.3g} GB/s lat {r['latency_us']:.0f} us"
                                if r.get("busbw") else "")
                             + (" (reused)" if r.get("reused") else "")
                             + (f" reason: {r['reason']}" if r["reason"] else ""))
        finally:
            base.log(f"down {name}")
            testbed.down(name)
    return {"nodes": n, "runs": runs}


def paired(runs: list[dict], a: str, b: str) -> list[float]:
    """a - b within each repetition where both succeeded."""
    by = {(r["rep"], r["call"]): r for r in runs if r["ok"]}
    return [by[(rep, a)]["wall_s"] - by[(rep, b)]["wall_s"]
            for rep in sorted({r["rep"] for r in runs})
            if (rep, a) in by and (rep, b) in by]


def summarize(sizes: list[dict]) -> list[dict]:
    rows = []
    for s in sizes:
        runs = s["runs"]
        ok = {k: [r for r in runs if r["call"] == k and r["ok"]] for k in TIMED}
        fresh = ok["v1"] + ok["l1"]
        rows.append({
            "nodes": s["nodes"],
            "reps": len({r["rep"] for r in runs}),
            "warmup_s": base.med([r["wall_s"] for r in runs if r["call"] == "warmup"]),
            "failed": [f"{r['call']}#{r['rep']}" for r in runs if not r["ok"]],
            **{f"{k}_s": base.med([r["wall_s"] for r in ok[k]]) for k in TIMED},
            "check_s": base.med(paired(runs, "v1", "v0")),
            "module_v1_s": base.med([r.get("module_s") for r in ok["v1"]]),
            "module_l1_s": base.med([r.get("module_s") for r in ok["l1"]]),
            "task_s": base.med([r.get("task_s") for r in fresh]),
            "reuse_s": base.med(paired(runs, "v2", "v0")),
            "reused": sum(1 for r in ok["v2"] if r.get("reused")),
            "overhead_s": base.med(paired(runs, "l1", "l0")),
            "busbw": base.med([r.get("busbw") for r in fresh]),
            "latency_us": base.med([r.get("latency_us") for r in fresh]),
        })
    return rows


def table(rows: list[dict]) -> str:
    f = base.fmt
    lines = ["| nodes | reps | verify never (s) | check v1-v0 (s) | module max v1 / l1 (s) "
             "| reuse v2-v0 (s) | launch never (s) | overhead l1-l0 (s) | busbw (GB/s) "
             "| latency (us) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['nodes']} | {r['reps']} | {f(r['v0_s'])} | {f(r['check_s'])} "
            f"| {f(r['module_v1_s'])} / {f(r['module_l1_s'])} | {f(r['reuse_s'])} "
            f"| {f(r['l0_s'])} | {f(r['overhead_s'])} | {f(r['busbw'], '.3g')} "
            f"| {f(r['latency_us'], '.0f')} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="2,4,8")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    info = base.machine()
    info["note"] = ("nodes are podman containers on this same machine, sharing its CPUs with "
                    "the controller and whatever else runs here")
    base.log(f"machine: {info}")
    work = Path(tempfile.mkdtemp(prefix="thbench-ic-"))
    (work / "code").mkdir()
    shutil.copy(ROOT / "examples" / "allreduce.py", work / "code" / "allreduce.py")
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-interconnect.json"
    sizes = []
    try:
        for n in [int(x) for x in args.sizes.split(",")]:
            sizes.append(run_size(n, args.reps, work))
            path.write_text(json.dumps({"machine": info, "sizes": sizes,
                                        "loadavg_now": os.getloadavg()},
                                       indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = summarize(sizes)
    data = json.loads(path.read_text())
    data["summary"] = rows
    path.write_text(json.dumps(data, indent=1))
    print(f"Machine: {info['nproc']} CPUs ({info['cpu']}), load average at start "
          f"{' '.join(f'{x:.2f}' for x in info['loadavg'])}, {info['date']}; {info['note']}.")
    print(f"Results: {path.relative_to(ROOT)}\n")
    print(table(rows))
    failed = [f"{r['nodes']} nodes: {', '.join(r['failed'])}" for r in rows if r["failed"]]
    if failed:
        print("\nFailed calls (see the results file for reason and gate problems): "
              + "; ".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
