"""A run directory as the controller holds it after a long failed launch on many nodes, for
`torchherd show`'s tests: plan.json, schedule.json, marks.json and summary.json in the shapes
a real launch writes them (runs/ of a launch on local nodes), each node's run record with a
`use` section of samples (module_utils/_use's points) and its node.log."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

T0 = 1_795_000_000.0
# What a rank of the failing node wrote: markup that the page must show as text.
HOSTILE = '<script>alert("x")</script> & <b>bold</b>'


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def use_section(hours: float, every: float, gpus: int, seed: int) -> dict[str, Any]:
    """A node's `use` section: one point every ``every`` s over ``hours``, [time, samples,
    CPU %, memory MiB, [[GPU %, GPU MiB] per GPU]], the node's clock 0.5 s ahead."""
    points = []
    count = int(hours * 3600 / every)
    for i in range(count):
        at = T0 + 20 + i * every + 0.5
        wave = 0.5 + 0.5 * math.sin(i / 37.0 + seed)
        points.append([round(at, 2), 1, round(20 + 60 * wave, 1), round(200_000 + 50_000 * wave),
                       [[round(min(100.0, 70 + 30 * wave - g), 1), round(40_000 + 30_000 * wave)]
                        for g in range(gpus)]])
    return {"every": every, "per": 1, "step": every, "gpus": list(range(gpus)),
            "gpu_memory_total_mib": [81_559] * gpus, "memory_total_mib": 1_031_000,
            "points": points, "recent": points[-3:]}


def failed_run(runs: Path, run_id: str = "20261128-120000-beef", nodes: int = 64,
               hours: float = 24.0, every: float = 60.0, gpus: int = 8,
               samples: bool = True, summary: bool = True) -> Path:
    """A launch of ``nodes`` nodes that ran ``hours`` until node3's rank failed; the others were
    stopped. Without ``summary`` the directory is that of a running job no collect summed up
    yet (plan, schedule, marks of the phases so far, the nodes' records and logs)."""
    run_dir = runs / run_id
    hosts = [f"gpu{i:02d}" for i in range(nodes)]
    end = T0 + 20 + hours * 3600
    _write(run_dir / "plan.json", {
        "run_id": run_id, "launched_at": T0 - 1.2, "started_at": T0, "world_size": nodes * gpus,
        "nnodes": str(nodes), "nproc_per_node": gpus, "restart": 0, "spares": [],
        "excluded": {}, "master": {"host": hosts[0], "addr": "10.0.0.1", "port": 29500},
        "job": {"launcher": "torchrun", "rdzv": "static", "nproc_per_node": gpus},
        "nodes": [{"host": h, "node_rank": i, "address": f"10.0.0.{i + 1}",
                   "nproc_per_node": gpus} for i, h in enumerate(hosts)]})
    _write(run_dir / "schedule.json", {"spawn": {h: "ssh" for h in hosts}, "nodes": nodes})
    marks = {"plan": T0 + 0.3, "preflight": T0 + 4.0}
    if summary:
        marks.update(watch=end + 3.0, collect=end + 9.0)
    _write(run_dir / "marks.json", marks)
    entries = {}
    for i, host in enumerate(hosts):
        failed = i == 3
        state = "failed" if failed else "stopped"
        started, first = T0 + 12 + i * 0.01, T0 + 20 + i * 0.01
        ended = end + (0.0 if failed else 1.5)
        entries[host] = {
            "node_rank": i, "address": f"10.0.0.{i + 1}", "state": state, "standby": False,
            "exit_code": 1 if failed else -15, "unreachable": False, "error": None,
            "last_line": HOSTILE if failed else f"[default0]:step {int(hours * 3600)} loss 0.1",
            "started_at": started, "ended_at": ended, "first_output_at": first,
            "attempts": {}, "lost_at": None, "clock_offset": 0.5, "checked_at": ended + 2,
            "warm": {"used": True, "started_at": T0 + 3.0, "ready_at": T0 + 7.5},
            "failing_rank": 3 * gpus + 5 if failed else None,
            "exception": f"RuntimeError: {HOSTILE}" if failed else None,
            "traceback": f"Traceback (most recent call last):\n  ...\nRuntimeError: {HOSTILE}"
            if failed else None, "logs_fetched": True}
        record = {"schema": 1, "seq": 9, "updated_at": ended + 0.5,
                  "job": {"started_at": started + 0.5, "first_output_at": first + 0.5,
                          **({"ended_at": ended + 0.5, "exit_code": entries[host]["exit_code"]}
                             if summary else {})},
                  "use": use_section(hours, every, gpus, i) if samples else {}}
        _write(run_dir / "nodes" / host / "run.json", record)
        log = [f"[default{r}]:step {s} loss 0.{s % 97}" for s in range(40) for r in (0, 1)]
        if failed:
            log += [f"[default5]:[rank{3 * gpus + 5}]: RuntimeError: {HOSTILE}"]
        (run_dir / "nodes" / host / "node.log").write_text("\n".join(log) + "\n",
                                                            encoding="utf-8")
    if summary:
        reason = f"node gpu03 (node_rank 3) rank {3 * gpus + 5}: RuntimeError: {HOSTILE}"
        _write(run_dir / "summary.json", {
            "run_id": run_id, "state": "failed", "reason": reason, "cause": "gpu03",
            "cause_kind": "exception", "restart": 0, "written_at": end + 9.0,
            "world_size": nodes * gpus, "nnodes": str(nodes), "nproc_per_node": gpus,
            "master": {"host": hosts[0], "addr": "10.0.0.1", "port": 29500},
            "timings": {"launch": 1.2, "plan": 0.3, "preflight": 3.7, "sync": 2.1, "start": 1.4,
                        "watch": hours * 3600, "collect": 6.0, "first_output": 21.2,
                        "total": hours * 3600 + 30},
            "hosts": entries, "hang": None, "left_out": {}, "preflight_warnings": []})
    return run_dir


def restarted_run(runs: Path, run_id: str = "20261128-130000-cafe") -> Path:
    """A 3-node run whose node1 was lost; the driver restarted it with spare node3 in
    node_rank 1 (the first launch kept under restarts/0), and it succeeded."""
    run_dir = failed_run(runs, run_id, nodes=3, hours=0.01, every=5, gpus=1, samples=False)
    first = run_dir / "restarts" / "0"
    first.mkdir(parents=True)
    for name in ("plan.json", "summary.json", "marks.json", "nodes"):
        (run_dir / name).rename(first / name)
    lost_at = T0 + 40
    summary = json.loads((first / "summary.json").read_text(encoding="utf-8"))
    summary["hosts"]["gpu01"].update(state="lost", lost_at=lost_at, ended_at=None,
                                     error="ssh: connection reset", exception=None)
    summary.update(state="failed", cause="gpu01", cause_kind="node_lost",
                   reason="node gpu01 (node_rank 1) was lost: ssh: connection reset")
    _write(first / "summary.json", summary)
    # The second launch: gpu00, gpu03 (the spare, in rank 1), gpu02.
    again = failed_run(runs / "again", run_id, nodes=4, hours=0.01, every=5, gpus=1,
                       samples=True)
    plan = json.loads((again / "plan.json").read_text(encoding="utf-8"))
    plan.update(started_at=T0 + 60, launched_at=T0 + 59, restart=1)
    plan["nodes"] = [n for n in plan["nodes"] if n["host"] != "gpu01"]
    plan["nodes"][1]["node_rank"], plan["nodes"][2]["node_rank"] = 2, 1
    _write(run_dir / "plan.json", plan)
    summary = json.loads((again / "summary.json").read_text(encoding="utf-8"))
    hosts = {h: dict(e, state="succeeded", exit_code=0, exception=None, traceback=None,
                     failing_rank=None, started_at=e["started_at"] + 60,
                     first_output_at=e["first_output_at"] + 60, ended_at=e["ended_at"] + 60)
             for h, e in summary["hosts"].items() if h != "gpu01"}
    hosts["gpu03"]["node_rank"], hosts["gpu02"]["node_rank"] = 1, 2
    summary.update(state="succeeded", reason="every node exited 0", cause=None,
                   cause_kind=None, hosts=hosts, restart=1, written_at=T0 + 200,
                   incidents=[{"restart": 1, "at": lost_at, "kind": "node_lost", "node": "gpu01",
                               "node_rank": 1, "why": "node gpu01 (node_rank 1) was lost",
                               "replaced_by": "gpu03", "first_output_after": 41.0}])
    _write(run_dir / "summary.json", summary)
    _write(run_dir / "marks.json", {"plan": T0 + 60.3, "preflight": T0 + 64, "watch": T0 + 190,
                                    "collect": T0 + 195})
    (again / "nodes").rename(run_dir / "nodes")
    shutil.rmtree(run_dir / "nodes" / "gpu01")
    return run_dir
