"""The drawing of `torchherd show`'s page (driver/show.py gathers what it draws): the timeline's
scale and axis, each node's lane (bars for its phases, marks for its first output, end, loss,
restarts and the spare that took its rank), and the sparklines of what its job used. Only
numbers and the texts of tooltips come out of here; the template (show.html.j2) writes the
SVG elements and escapes every text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# The timeline's geometry (SVG user units): the lanes' labels left of the plot.
WIDTH, LABEL, PAD = 1100, 190, 16
AXIS, LANE, BAR = 34, 20, 12
# The lanes begin below the axis and the row of the run's phases.
TOP = AXIS + 26
SPARK_W, SPARK_H = 240, 28
# Points per sparkline: a day of samples on 64 nodes makes a page of some 300 KB at this.
SERIES_POINTS = 240
# An axis's steps: seconds below a minute, then whole minutes, then whole hours.
_STEPS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
          3600, 7200, 3 * 3600, 6 * 3600, 12 * 3600, 86400)


def duration(value: float | None) -> str:
    """A duration as people read it: 0.4 s, 12.3 s, 4 min 05 s, 3 h 02 min."""
    if value is None:
        return "-"
    if value < 100:
        return f"{value:.1f} s"
    if value < 3600:
        return f"{int(value // 60)} min {int(value % 60):02d} s"
    return f"{int(value // 3600)} h {int(value % 3600 // 60):02d} min"


@dataclass(frozen=True)
class Scale:
    """The run's span, from ``origin`` to ``end`` (seconds on the controller's clock), over
    the plot's width."""

    origin: float
    end: float

    def x(self, at: float) -> float:
        return round(LABEL + (at - self.origin) / (self.end - self.origin)
                     * (WIDTH - LABEL - PAD), 1)

    def since(self, at: float) -> str:
        return "+" + duration(at - self.origin)

    def ticks(self, count: int = 8) -> list[dict[str, Any]]:
        """About ``count`` round steps of the axis: where, what they say, how they align."""
        span = self.end - self.origin
        raw = max(span, 1e-3) / count
        step = next((s for s in _STEPS if s >= raw), 86400 * math.ceil(raw / 86400))
        found = []
        for i in range(int(span / step + 1e-9) + 1):
            at = i * step
            label = (f"{round(at, 2):g} s" if step < 60 else f"{int(at // 60)} min"
                     if step < 3600 else f"{int(at // 3600)} h")
            x = self.x(self.origin + at)
            found.append({"x": x, "label": label,
                          "anchor": "end" if x > WIDTH - 30 else "middle"})
        return found


@dataclass
class Lane:
    """One node's lane of the timeline."""

    host: str
    label: str
    y: float = 0.0
    bars: list[dict[str, Any]] = field(default_factory=list)
    marks: list[dict[str, Any]] = field(default_factory=list)

    def bar(self, scale: Scale, begin: float | None, end: float | None, cls: str, title: str,
            faded: bool = False) -> None:
        if begin is None or end is None or end < begin:
            return
        x0 = scale.x(begin)
        self.bars.append({"x": x0, "w": max(1.5, round(scale.x(end) - x0, 1)), "cls": cls,
                          "title": title, "faded": faded})

    def mark(self, scale: Scale, at: float | None, cls: str, title: str,
             faded: bool = False) -> None:
        if at is not None:
            self.marks.append({"x": scale.x(at), "cls": cls, "title": title, "faded": faded})


def part_ended(times: dict[str, float | None]) -> float | None:
    """When the node's part in the job ended: a lost node's where the gang lost it, whatever
    the node did after."""
    return min((t for t in (times["ended"], times["lost"]) if t is not None), default=None)


def draw_node(lane: Lane, scale: Scale, entry: dict[str, Any], times: dict[str, float | None],
              last_seen: float | None, which: str = "") -> None:
    """One launch's part of a node in its lane: the launcher started ahead, the start until
    the first output, the job until its end (or until ``last_seen`` while it runs), and the
    marks of its first output, end, loss and torchrun's restarts. ``which`` names an earlier
    launch (drawn faded)."""
    host, faded = lane.host, bool(which)
    state = entry.get("state") or "unknown"
    last = part_ended(times)
    if last is None and state in ("running", "unknown") and (
            times["started"] is not None or times["first_output"] is not None):
        last = max(t for t in (last_seen, times["first_output"], times["started"])
                   if t is not None)
    if times["warm_started"] is not None and times["warm_ready"] is not None:
        lane.bar(scale, times["warm_started"], times["warm_ready"], "warm",
                 f"{host}: launcher started ahead, imports done after "
                 f"{duration(times['warm_ready'] - times['warm_started'])}{which}", faded)
    first = times["first_output"]
    if first is not None:
        lane.bar(scale, times["started"], first, "starting",
                 f"{host}: started, first output after "
                 f"{duration(first - (times['started'] or first))}{which}", faded)
        lane.bar(scale, first, last, f"s-{state}",
                 f"{host}: {state}, exit code {entry.get('exit_code')}{which}", faded)
        lane.mark(scale, first, "out", f"{host}: first output at {scale.since(first)}{which}",
                  faded)
    else:
        lane.bar(scale, times["started"], last, "starting",
                 f"{host}: started, no output yet ({state}){which}", faded)
    if times["ended"] is not None:
        lane.mark(scale, times["ended"], f"end s-{state}",
                  f"{host}: ended {state}, exit code {entry.get('exit_code')} at "
                  f"{scale.since(times['ended'])}{which}", faded)
    if times["lost"] is not None:
        lane.mark(scale, times["lost"], "lost",
                  f"{host}: lost at {scale.since(times['lost'])}: "
                  f"{entry.get('error') or 'unreachable'}{which}", faded)
    for number, at in times_of_attempts(entry):
        lane.mark(scale, at, "attempt", f"{host}: torchrun's restart {number} of the "
                                        f"workers{which}", faded)


def times_of_attempts(entry: dict[str, Any]) -> list[tuple[str, float]]:
    """(number, start) of each attempt after the first where torchrun restarted the workers
    (the summary's ``attempts``, already on the controller's clock)."""
    return [(str(number), float(attempt["started_at"]))
            for number, attempt in sorted((entry.get("attempts") or {}).items())
            if str(number) != "0" and isinstance(attempt, dict)
            and isinstance(attempt.get("started_at"), (int, float))]


def draw_incidents(lanes: dict[str, Lane], scale: Scale, incidents: list[dict[str, Any]],
                   starts: dict[str, float | None]) -> list[dict[str, Any]]:
    """Each restart: a line across the lanes (returned), a mark on the node it left out, and
    one where the spare that took its rank started (``starts``: the current launch's)."""
    lines = []
    for inc in incidents:
        at = inc.get("at")
        if not isinstance(at, (int, float)):
            continue
        by = " (torchrun's)" if inc.get("by") == "torchrun" else ""
        lines.append({"x": scale.x(at), "label": f"restart {inc.get('restart')}"})
        node, spare = inc.get("node"), inc.get("replaced_by")
        if node in lanes:
            lanes[node].mark(scale, at, "incident", f"{node}: restart {inc.get('restart')}{by}: "
                                                    f"{inc.get('kind')}: {inc.get('why')}")
        if spare in lanes:
            lanes[spare].mark(scale, starts.get(spare) or at, "spare",
                              f"{spare} takes node_rank {inc.get('node_rank')} of {node} "
                              f"(restart {inc.get('restart')})")
    return lines


def downsample(times: list[float], values: list[float | None], begin: float, end: float,
               buckets: int = SERIES_POINTS, peak: bool = False,
               ) -> list[tuple[float, float | None]]:
    """At most ``buckets`` points over [begin, end]: the mean of each bucket's values (their
    peak with ``peak``, for memory, whose peaks matter), None where a bucket had none read.
    Empty buckets are left out, so a line breaks only where a node could not read a value."""
    if len(times) <= buckets:
        return list(zip(times, values, strict=True))
    width = (end - begin) / buckets or 1.0
    grouped: dict[int, list[float | None]] = {}
    for at, value in zip(times, values, strict=True):
        grouped.setdefault(min(buckets - 1, max(0, int((at - begin) / width))), []).append(value)
    out = []
    for index in sorted(grouped):
        known = [v for v in grouped[index] if v is not None]
        value = (max(known) if peak else sum(known) / len(known)) if known else None
        out.append((begin + (index + 0.5) * width, value))
    return out


def spark(times: list[float], values: list[float | None], scale: Scale,
          peak: bool = False) -> dict[str, Any]:
    """One sparkline: its SVG path (0..100 % over the box's height, the run's span over its
    width, a break where a value is missing), and the series' peak and mean. Whole pixels,
    each step relative to the one before (``l dx dy``): a quarter of the bytes of absolute
    coordinates, which is what a page of 64 nodes weighs."""
    begin, span = scale.origin, (scale.end - scale.origin) or 1.0
    segments: list[list[str]] = []  # each: its start (M x y), then its steps (dx dy)
    last: tuple[int, int] | None = None
    for at, value in downsample(times, values, begin, scale.end, peak=peak):
        if value is None:
            last = None
            continue
        x = round((at - begin) / span * SPARK_W)
        y = round(SPARK_H - 1 - min(100.0, max(0.0, value)) / 100.0 * (SPARK_H - 2))
        if last is None:
            segments.append([f"M{x} {y}"])
        elif (x, y) == last:
            continue
        else:
            segments[-1].append(f"{x - last[0]} {y - last[1]}")
        last = (x, y)
    known = [v for v in values if v is not None]
    return {"d": "".join(seg[0] + ("l" + " ".join(seg[1:]) if len(seg) > 1 else "h0")
                         for seg in segments),
            "peak": max(known) if known else None,
            "mean": sum(known) / len(known) if known else None}
