"""One run as a single HTML page (``torchherd show``): a timeline of every node, the per-node
table, the root cause of a failure with each node's last lines, and what each node's job used
(GPUs, CPU, memory) where its run record holds samples.

The page is made from what the controller already has for the run, nothing is asked of the
nodes: summary.json (the nodes' states and times, on the controller's clock, the root cause,
the incidents of restarts), marks.json (when the plays' phases ended), schedule.json, each
node's run record (nodes/<host>/run.json: the job's times on the node's clock, its `use`
samples) and the end of each node's log (nodes/<host>/node.log). A running job's page shows
what the last status or collect fetched; an earlier launch of a restarted run
(restarts/<n>/) is drawn faded in the same lanes.

The file stands alone: inline CSS and SVG, no script, nothing fetched, so that it opens from
a mail or an archive years later. Every text of the run is HTML-escaped by the template
(show.html.j2, autoescaped); driver/timeline.py draws (the SVG's geometry, the sparklines cut
to a few hundred points each, so that a day of samples on 64 nodes opens at once).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from driver.inputs import run_directory
from driver.logs import parse_line, static_nproc
from driver.result import RunInfo, read_json, run_info
from driver.timeline import (
    AXIS,
    BAR,
    LABEL,
    LANE,
    PAD,
    SPARK_H,
    SPARK_W,
    TOP,
    WIDTH,
    Lane,
    Scale,
    draw_incidents,
    draw_node,
    duration,
    part_ended,
    spark,
)

PAGE = "report.html"
TEMPLATE = "show.html.j2"
# The end of each node's log shown on the page, read from at most TAIL_BYTES.
LAST_LINES = 20
TAIL_BYTES = 64 << 10
# The phases of a launch, as the collection's timings name them, in their order.
PHASES = ("plan", "preflight", "sync", "start", "watch", "collect")
# The states a node's bar is drawn in (the legend's), as summary.json names them.
STATES = ("running", "succeeded", "failed", "lost", "timed_out", "stopped", "standby",
          "unknown")


def page_path(run_dir: Path, output: str | Path | None) -> Path:
    """Where the page goes: ``output``, else report.html beside the run's summary.json."""
    return Path(output).expanduser().resolve() if output else run_dir / PAGE


def write(run_id: str, *, runs_dir: str | Path | None = None,
          output: str | Path | None = None) -> tuple[Path, RunInfo]:
    """Write the page of run ``run_id``; returns where, and the run as ``runs()`` lists it."""
    run_dir = run_directory(run_id, runs_dir)
    path = page_path(run_dir, output)
    text = render(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.part.{os.getpid()}")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)
    info = run_info(run_dir)
    assert info is not None  # run_directory found its plan.json
    return path, info


def render(run_dir: Path) -> str:
    """The page of the run in ``run_dir``, as HTML text."""
    import jinja2  # only this action needs it

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent),
                             autoescape=True, trim_blocks=True, lstrip_blocks=True,
                             undefined=jinja2.StrictUndefined)
    return env.get_template(TEMPLATE).render(**model(run_dir))


# --- what the run directory holds ---------------------------------------------------------


@dataclass
class Launch:
    """One launch of the run: the run directory itself, or one kept under restarts/<n>/."""

    number: int | None  # the restart it was before, None for the current launch
    plan: dict[str, Any]
    summary: dict[str, Any]
    marks: dict[str, Any]
    records: dict[str, dict[str, Any]]
    base: Path


def _launch(base: Path, number: int | None) -> Launch:
    plan = read_json(base / "plan.json") or {}
    return Launch(number, plan, read_json(base / "summary.json") or {},
                  read_json(base / "marks.json") or {},
                  {n["host"]: read_json(base / "nodes" / n["host"] / "run.json") or {}
                   for n in plan.get("nodes") or []}, base)


def launches(run_dir: Path) -> list[Launch]:
    """The run's launches, oldest first: those kept by whole-job restarts, then the current."""
    kept = run_dir / "restarts"
    numbers = sorted(int(p.name) for p in kept.iterdir()
                     if p.name.isdigit() and (p / "plan.json").is_file()) if kept.is_dir() else []
    return [_launch(kept / str(n), n) for n in numbers] + [_launch(run_dir, None)]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _offset(entry: dict[str, Any]) -> float:
    """Seconds the node's clock is ahead of the controller's (0 where not measured)."""
    return _num(entry.get("clock_offset")) or 0.0


def host_times(entry: dict[str, Any], record: dict[str, Any]) -> dict[str, float | None]:
    """A node's times on the controller's clock: the summary's, else its run record's (the
    node's clock, put right by the clock offset the summary measured)."""
    job, offset = record.get("job") or {}, _offset(entry)

    def pick(key: str) -> float | None:
        found = _num(entry.get(key))
        if found is None and _num(job.get(key)) is not None:
            found = float(job[key]) - offset
        return found

    warm = entry.get("warm") or job.get("warm") or {}
    return {"started": pick("started_at"), "first_output": pick("first_output_at"),
            "ended": pick("ended_at"), "lost": _num(entry.get("lost_at")),
            "warm_started": _num(warm.get("started_at")) if warm.get("used") else None,
            "warm_ready": _num(warm.get("ready_at")) if warm.get("used") else None,
            "seen": (_num(record.get("updated_at")) or 0.0) - offset
            if record.get("updated_at") else None}


def phase_ends(plan: dict[str, Any], summary: dict[str, Any],
               marks: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(phase, begin, end) of each phase the run got to: the marks the plays wrote, the rest
    (sync, start) from the summary's timings, each phase ending where the next begins."""
    timings = summary.get("timings") or {}
    last = _num(plan.get("started_at"))
    found: list[tuple[str, float, float]] = []
    if last is None:
        return found
    launched = _num(plan.get("launched_at"))
    if launched is not None and launched < last:
        found.append(("launch", launched, last))
    for phase in PHASES:
        end = _num(marks.get(phase))
        if end is None and _num(timings.get(phase)) is not None:
            end = last + float(timings[phase])
        if end is not None:
            found.append((phase, last, end))
            last = end
    return found


def tail(path: Path, lines: int = LAST_LINES) -> list[str]:
    """The last ``lines`` lines of a log, read from its last TAIL_BYTES."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - TAIL_BYTES))
            data = handle.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-lines:]


# --- the samples of the `use` section -----------------------------------------------------


_NUMBER = (int, float)


def _pct(used: Any, total: Any) -> float | None:
    """``used`` as % of ``total``; None where either is not a number (the node could not read
    it) or the total is 0."""
    if type(used) in _NUMBER and type(total) in _NUMBER and total:
        return 100.0 * used / total
    return None


def use_series(use: dict[str, Any], offset: float) -> dict[str, Any] | None:
    """A node's samples (its record's `use` section) as the page's four series, in % on the
    controller's clock: CPU busy, memory used, GPU utilization (the mean of its GPUs) and GPU
    memory used (the fullest GPU); None where the record holds no samples. One pass over the
    points: a record of any length costs little more than reading it."""
    totals = list(use.get("gpu_memory_total_mib") or [])
    memory_total = use.get("memory_total_mib")
    times: list[float] = []
    cpu: list[float | None] = []
    memory: list[float | None] = []
    gpu: list[float | None] = []
    gpu_memory: list[float | None] = []
    for point in use.get("points") or []:
        if not isinstance(point, list) or len(point) < 5 or type(point[0]) not in _NUMBER:
            continue
        times.append(point[0] - offset)
        cpu.append(point[2] if type(point[2]) in _NUMBER else None)
        memory.append(_pct(point[3], memory_total))
        utils = [g[0] for g in point[4] or () if type(g[0]) in _NUMBER]
        gpu.append(sum(utils) / len(utils) if utils else None)
        shares = [share for i, g in enumerate(point[4] or ())
                  for share in (_pct(g[1], totals[i] if i < len(totals) else None),)
                  if share is not None]
        gpu_memory.append(max(shares) if shares else None)
    if not times:
        return None
    return {"times": times, "gpus": len(use.get("gpus") or []), "cpu": cpu, "memory": memory,
            "gpu": gpu, "gpu_memory": gpu_memory}


# --- the page's model ---------------------------------------------------------------------


def _clock(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at)) if at else "-"


def _node_row(host: str, entry: dict[str, Any], times: dict[str, float | None], scale: Scale,
              cause: str | None, launch: Launch, nproc: int | None) -> dict[str, Any]:
    """A node's row of the table: the current launch's entry, else the last one that ran on
    it (a node a spare replaced)."""
    def since(at: float | None) -> str:
        return duration(at - scale.origin) if at is not None else "-"

    exit_code, rank = entry.get("exit_code"), entry.get("node_rank")
    standby = " (standby)" if entry.get("standby") else ""
    note = entry.get("exception") or entry.get("error") or (
        parse_line(host, rank, nproc, entry["last_line"]).short if entry.get("last_line")
        else "")
    return {"host": host,
            "rank": "-" if rank is None else f"{rank}{standby}",
            "state": entry.get("state") or "unknown",
            "exit": "-" if exit_code is None else str(exit_code),
            "failing_rank": entry.get("failing_rank"),
            "started": since(times["started"]), "first_output": since(times["first_output"]),
            "ended": since(part_ended(times)), "note": note, "cause": host == cause,
            "launch": "" if launch.number is None else
            f"launch before restart {launch.number + 1}"}


@dataclass
class NodePart:
    """One node in one launch: its summary entry (the plan's rank where no summary has it
    yet) and its times on the controller's clock."""

    launch: Launch
    host: str
    entry: dict[str, Any]
    times: dict[str, float | None]


def _parts(runs: list[Launch]) -> list[NodePart]:
    parts = []
    for run in runs:
        hosts = run.summary.get("hosts") or {}
        for node in run.plan.get("nodes") or []:
            entry = {"node_rank": node.get("node_rank"), "standby": node.get("standby"),
                     "state": "unknown", **(hosts.get(node["host"]) or {})}
            parts.append(NodePart(run, node["host"], entry,
                                  host_times(entry, run.records.get(node["host"]) or {})))
    return parts


def _scale(runs: list[Launch], parts: list[NodePart], phases: list[Any],
           samples: dict[str, dict[str, Any] | None]) -> Scale:
    """From the first launch's start to the last moment anything was seen (at least 1 s)."""
    origin = min((t for r in runs for t in (_num(r.plan.get("launched_at")),
                                            _num(r.plan.get("started_at"))) if t is not None),
                 default=time.time())
    seen = [origin, *(t for r in runs for t in (_num(r.summary.get("written_at")),)
                      if t is not None)]
    seen += [end for _r, spans in phases for _p, _b, end in spans]
    seen += [t for part in parts for t in part.times.values() if t is not None]
    seen += [float(i["at"]) for i in runs[-1].summary.get("incidents") or []
             if _num(i.get("at")) is not None]
    seen += [t for s in samples.values() if s for t in (s["times"][0], s["times"][-1])]
    return Scale(origin, max(max(seen), origin + 1.0))


def _lanes(parts: list[NodePart], current: Launch, scale: Scale) -> dict[str, Lane]:
    """One lane per host: the current launch's nodes by rank, then those only earlier
    launches ran on; each launch's part of the node drawn in it, the earlier ones faded."""
    lanes: dict[str, Lane] = {}
    for part in sorted(parts, key=lambda p: (p.launch is not current,
                                             p.entry.get("node_rank") is None,
                                             p.entry.get("node_rank") or 0)):
        lane = lanes.setdefault(part.host, Lane(part.host, part.host))
        if part.launch is current:
            # node_rank, not r<rank>: logs names a global rank so.
            rank = part.entry.get("node_rank")
            name = part.host if len(part.host) <= 24 else part.host[:23] + "\u2026"
            lane.label = name if rank is None else f"{name}  node_rank {rank}"
            if part.entry.get("standby"):
                lane.label += " (standby)"
        which = "" if part.launch.number is None else \
            f" (the launch before restart {part.launch.number + 1})"
        seen = [t for t in (part.times["seen"], _num(part.launch.summary.get("written_at")))
                if t is not None]
        draw_node(lane, scale, part.entry, part.times, max(seen, default=None), which)
    for index, lane in enumerate(lanes.values()):
        lane.y = TOP + index * LANE
    return lanes


def _last_lines(runs: list[Launch], hosts: list[str], cause: str | None,
                nproc: int | None) -> list[dict[str, Any]]:
    """Each node's last lines, named as `logs` names them, from the newest launch that
    fetched its log."""
    ranks = {n["host"]: n.get("node_rank") for r in runs for n in r.plan.get("nodes") or []}
    found = []
    for host in hosts:
        log = next((r.base / "nodes" / host / "node.log" for r in reversed(runs)
                    if (r.base / "nodes" / host / "node.log").is_file()), None)
        lines = [parse_line(host, ranks.get(host), nproc, raw).short
                 for raw in (tail(log) if log else [])]
        found.append({"host": host, "lines": lines, "cause": host == cause,
                      "fetched": log is not None})
    return found


def _use(hosts: list[str], samples: dict[str, dict[str, Any] | None],
         scale: Scale) -> list[dict[str, Any]]:
    """Each node's sparklines (CPU, memory, GPU utilization, GPU memory), or None."""
    rows = []
    for host in hosts:
        series = samples.get(host)
        if series is None:
            rows.append({"host": host, "gpus": 0, "series": None})
            continue
        t = series["times"]
        rows.append({"host": host, "gpus": series["gpus"], "series": [
            ("CPU busy", spark(t, series["cpu"], scale)),
            ("memory", spark(t, series["memory"], scale, peak=True)),
            ("GPU util (mean)", spark(t, series["gpu"], scale)),
            ("GPU memory (fullest)", spark(t, series["gpu_memory"], scale, peak=True))]})
    return rows


def model(run_dir: Path) -> dict[str, Any]:
    """Everything the template shows, computed from the run directory."""
    info = run_info(run_dir)
    runs = launches(run_dir)
    current = runs[-1]
    plan, summary = current.plan, current.summary
    schedule = read_json(run_dir / "schedule.json") or {}
    preflight = read_json(run_dir / "preflight.json") or {}
    job = plan.get("job") or {}
    parts = _parts(runs)
    phases = [(r, phase_ends(r.plan, r.summary, r.marks)) for r in runs]
    samples = {p.host: use_series((current.records.get(p.host) or {}).get("use") or {},
                                  _offset(p.entry))
               for p in parts if p.launch is current}
    scale = _scale(runs, parts, phases, samples)
    lanes = _lanes(parts, current, scale)
    incidents = list(summary.get("incidents") or [])
    restarts = draw_incidents(lanes, scale, incidents,
                              {p.host: p.times["started"] for p in parts if p.launch is current})
    nproc = static_nproc(plan, preflight)
    latest = {p.host: p for p in parts}  # oldest launch first: the current one wins
    cause = summary.get("cause")
    timings = summary.get("timings") or {}
    gate = preflight.get("gate") or {}
    return {
        "run_id": run_dir.name, "state": info.state if info else "unknown",
        "reason": info.reason if info else "", "cause": cause,
        "cause_kind": summary.get("cause_kind"),
        "traceback": ((summary.get("hosts") or {}).get(cause) or {}).get("traceback"),
        "hang": summary.get("hang"),
        "launcher": job.get("launcher") or "torchrun", "rdzv": job.get("rdzv") or "static",
        "spawn": ", ".join(sorted(set((schedule.get("spawn") or {}).values()))) or "-",
        "world_size": summary.get("world_size") or plan.get("world_size"),
        "nproc_per_node": summary.get("nproc_per_node") or plan.get("nproc_per_node"),
        "master": summary.get("master") or plan.get("master") or {},
        "launched": _clock(scale.origin), "written": _clock(_num(summary.get("written_at"))),
        "span": duration(scale.end - scale.origin), "restart": summary.get("restart") or 0,
        "timings": [(p, duration(_num(timings.get(p))))
                    for p in ("launch", *PHASES, "first_output", "total")
                    if _num(timings.get(p)) is not None],
        "problems": [{"fix": None, **p} for p in gate.get("problems") or []],
        "left_out": {**(preflight.get("left_out") or {}), **(summary.get("left_out") or {})},
        "incidents": [{**dict.fromkeys(("restart", "by", "kind", "node", "node_rank",
                                        "replaced_by", "first_output_after", "why")), **i,
                       "at": scale.since(float(i["at"])) if _num(i.get("at")) is not None
                       else "-"} for i in incidents],
        "rows": [_node_row(host, latest[host].entry, latest[host].times, scale, cause,
                           latest[host].launch, nproc) for host in lanes],
        "logs": _last_lines(runs, list(lanes), cause, nproc),
        "use": _use(list(lanes), samples, scale),
        # The nodes whose GPUs sat idle while the others' worked (the summary's idle_gpus).
        "idle": {h: duration(_num(t)) for h, t in (summary.get("idle_gpus") or {}).items()},
        "svg": {"width": WIDTH, "height": TOP + len(lanes) * LANE + 8, "label": LABEL,
                "right": WIDTH - PAD, "axis": AXIS, "bar": BAR, "lanes": list(lanes.values()),
                "ticks": scale.ticks(), "restarts": restarts,
                "phases": [{"x": scale.x(b), "w": max(1.0, round(scale.x(e) - scale.x(b), 1)),
                            "name": p, "faded": r is not current,
                            "title": f"{p}: {duration(e - b)}" + (
                                "" if r.number is None else
                                f" (the launch before restart {r.number + 1})")}
                           for r, spans in phases for p, b, e in spans]},
        "spark": {"width": SPARK_W, "height": SPARK_H},
        "states": STATES, "phase_names": ("launch", *PHASES),
    }
