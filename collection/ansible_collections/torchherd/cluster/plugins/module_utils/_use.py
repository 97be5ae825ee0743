# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What a node's job uses while it runs: each GPU's utilization and memory (nvidia-smi's query,
which opens no CUDA context), the node's CPU and memory. The job's supervisor samples them at
the interval the schedule sets (start.sample_every) and keeps them in the node's run record
(its `use` section), bounded for a job of any length: at most POINTS samples, and when full,
every two neighbours become one (their mean utilization, their peak memory) and each point
from then on takes twice the samples. A week-long job keeps its whole course at one coarser
grain (at 5 s, a week in points of about 42 minutes); `recent` holds the last samples as
they were taken.

A point is a list: [time (the node's clock), samples merged in it, CPU busy % of the whole node,
memory used MiB, [[GPU utilization %, GPU memory used MiB], ...] in the order of `gpus`].
A value the node could not read is None."""

from __future__ import annotations

import bisect
import os
import shutil
import subprocess
import threading
import time

POINTS = 240
# Seconds from the launcher's start to the first sample.
FIRST = 1.0
# The samples kept as taken, for the live view and a node idle now.
RECENT = 3
GPU_QUERY = ["--query-gpu=index,utilization.gpu,memory.used,memory.total",
             "--format=csv,noheader,nounits"]
SMI_TIMEOUT = 5
# A GPU below this utilization is idle; one at or above WORKING works.
IDLE, WORKING = 5.0, 30.0


def _number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None  # "[N/A]", "[Not Supported]"


def parse_gpu_use(text):
    """nvidia-smi's answer to GPU_QUERY: [(index, utilization %, memory used MiB, memory total
    MiB)], a value it could not read None."""
    gpus = []
    for line in (text or "").splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 4 or not fields[0].isdigit():
            continue
        gpus.append((int(fields[0]), *(_number(f) for f in fields[1:])))
    return gpus


def cpu_times(proc="/proc"):
    """(busy, total) jiffies of the whole node since boot (/proc/stat's first line)."""
    try:
        with open(os.path.join(proc, "stat"), encoding="ascii") as handle:
            fields = [int(v) for v in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = sum(fields[3:5])  # idle, iowait
    return sum(fields) - idle, sum(fields)


def memory(proc="/proc"):
    """(used MiB, total MiB) of the node: MemTotal less MemAvailable."""
    values = {}
    try:
        with open(os.path.join(proc, "meminfo"), encoding="ascii") as handle:
            for line in handle:
                key, _sep, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    values[key] = int(rest.split()[0]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None, None
    if len(values) < 2:
        return None, values.get("MemTotal")
    return values["MemTotal"] - values["MemAvailable"], values["MemTotal"]


def busy_percent(before, after):
    """The node's CPU busy % between two cpu_times."""
    if not before or not after or after[1] <= before[1]:
        return None
    return round(100.0 * (after[0] - before[0]) / (after[1] - before[1]), 1)


def _mean(a, b, na, nb):
    if a is None or b is None:
        return a if b is None else b
    return round((a * na + b * nb) / (na + nb), 1)


def _peak(a, b):
    if a is None or b is None:
        return a if b is None else b
    return max(a, b)


def merge(a, b):
    """Two neighbouring points as one: the first's time, the mean of the utilizations (each
    point weighed by the samples in it), the peak of the memories."""
    na, nb = a[1], b[1]
    gpus = [[_mean(ga[0], gb[0], na, nb), _peak(ga[1], gb[1])]
            for ga, gb in zip(a[4], b[4])]
    return [a[0], na + nb, _mean(a[2], b[2], na, nb), _peak(a[3], b[3]), gpus]


def add(use, point, limit=POINTS):
    """`use` (the record's section) with `point` added, at most `limit` points kept, each of
    them `per` samples (the last one filling up), so that the whole course keeps one grain;
    `recent` keeps the last RECENT samples themselves."""
    per = int(use.get("per") or 1)
    points = list(use.get("points") or [])
    if points and points[-1][1] < per:
        points[-1] = merge(points[-1], point)
    else:
        points.append(point)
    if len(points) > limit:
        # Every two neighbours become one; an odd last point stays (and fills up).
        points = [merge(points[i], points[i + 1]) if i + 1 < len(points) else points[i]
                  for i in range(0, len(points), 2)]
        per *= 2
    return dict(use, points=points, per=per, step=float(use.get("every") or 0) * per,
                recent=(list(use.get("recent") or []) + [point])[-RECENT:])


def stats(use):
    """Per GPU (in the order of use.gpus): peak memory MiB, mean utilization %; the node's
    peak memory and mean CPU; from every point kept (each weighed by its samples)."""
    points = use.get("points") or []

    def weighed(values):
        pairs = [(v, p[1]) for v, p in zip(values, points) if v is not None]
        total = sum(n for _v, n in pairs)
        return round(sum(v * n for v, n in pairs) / total, 1) if total else None

    def peak(values):
        known = [v for v in values if v is not None]
        return max(known) if known else None

    gpus = []
    for i, index in enumerate(use.get("gpus") or []):
        util = [p[4][i][0] if i < len(p[4]) else None for p in points]
        mem = [p[4][i][1] if i < len(p[4]) else None for p in points]
        gpus.append({"index": index, "mean_util": weighed(util), "peak_memory_mib": peak(mem),
                     "memory_total_mib": (use.get("gpu_memory_total_mib") or [None] * (i + 1))[i]})
    return {"samples": sum(p[1] for p in points), "gpus": gpus,
            "mean_cpu": weighed([p[2] for p in points]),
            "peak_memory_mib": peak([p[3] for p in points]),
            "memory_total_mib": use.get("memory_total_mib")}


def brief(use):
    """The section as a module's answer carries it: its points left out (the record keeps them,
    collect brings them back), the last one and the stats in their place."""
    if not use:
        return {}
    summed = stats(use)
    recent = use.get("recent") or []
    return dict({k: v for k, v in use.items() if k != "points"}, stats=summed,
                cell=compact(summed), now=point_cell(recent[-1]) if recent else "")


def _gib(mib):
    return f"{mib / 1024:.1f}G"


def compact(stats):
    """A node's stats in a table's cell: its GPUs' mean utilization and the peak memory of its
    fullest GPU, else its CPU's mean and its memory's peak ("" where nothing was read)."""
    gpus = [g for g in stats.get("gpus") or [] if g.get("mean_util") is not None]
    if gpus:
        util = sum(g["mean_util"] for g in gpus) / len(gpus)
        peak = max((g["peak_memory_mib"] for g in gpus if g.get("peak_memory_mib") is not None),
                   default=None)
        return f"gpu {util:.0f}%" + (f" {_gib(peak)}" if peak is not None else "")
    if stats.get("mean_cpu") is None:
        return ""
    return f"cpu {stats['mean_cpu']:.0f}%" + (
        f" {_gib(stats['peak_memory_mib'])}" if stats.get("peak_memory_mib") is not None else "")


def mean_util(point):
    """A sample's mean GPU utilization %, None where it has no GPU that told it."""
    values = [g[0] for g in point[4] if g[0] is not None]
    return sum(values) / len(values) if values else None


def point_cell(point):
    """One sample in a table's cell (the live view's): its GPUs' mean utilization and the
    memory of its fullest GPU, else the node's CPU and memory."""
    gpus = [g for g in point[4] if g[0] is not None]
    if gpus:
        peak = max((g[1] for g in gpus if g[1] is not None), default=None)
        return f"gpu {sum(g[0] for g in gpus) / len(gpus):.0f}%" + (
            f" {_gib(peak)}" if peak is not None else "")
    if point[2] is None:
        return ""
    return f"cpu {point[2]:.0f}%" + (f" {_gib(point[3])}" if point[3] is not None else "")


def use_of(section):
    """What a summary keeps of a node's use: the brief (the stats and recent samples) of the
    record's section, whether the copy at hand holds the points (the node's record) or is an
    answer's brief already; None where nothing was sampled."""
    if not section or not (section.get("points") or section.get("recent")):
        return None
    return brief(section) if "points" in section else dict(section)


def _all_gpus(point, test):
    values = [g[0] for g in point[4]]
    return bool(values) and all(v is not None and test(v) for v in values)


def idle_spells(series, least=RECENT, now=False):
    """The nodes whose GPUs all sat idle for `least` samples in a row or more while another
    node's GPUs all worked at those times: {host: the longest such spell in seconds}. On a
    real cluster that is the straggler or the stuck rank a user looks for. `series`: {host:
    its points, oldest first (the record's points, or the recent samples of an answer)};
    `now`: only a spell that lasts to the node's last sample (the live view's "idle now").
    The nodes' clocks are taken as they are (their points are seconds apart)."""
    working = {h: sorted(p[0] for p in pts if _all_gpus(p, lambda v: v >= WORKING))
               for h, pts in series.items()}
    spells = {}
    for host, points in series.items():
        others = [times for h, times in working.items() if h != host and times]
        if not others or not points:
            continue
        step = (points[-1][0] - points[0][0]) / max(1, len(points) - 1) if len(points) > 1 else 0
        run, longest = [], 0.0
        for point in points:
            near = any(_near(times, point[0], max(step, 1.0)) for times in others)
            if near and _all_gpus(point, lambda v: v < IDLE):
                run.append(point)
                if len(run) >= least:
                    longest = max(longest, run[-1][0] - run[0][0] + step)
            else:
                run = []
        if longest and (not now or len(run) >= least):
            spells[host] = round(longest if not now else run[-1][0] - run[0][0] + step, 1)
    return spells


def _near(times, at, within):
    """Whether a time of the sorted `times` lies within `within` s of `at`."""
    i = bisect.bisect_left(times, at - within)
    return i < len(times) and times[i] <= at + within


class Sampler:
    """The supervisor's sampling thread: every `every` s a point into the record's `use`
    section (through `write(section_fields)`), until stopped."""

    def __init__(self, every, write, proc="/proc", smi=None):
        self.every, self.write, self.proc = float(every), write, proc
        self.smi = smi if smi is not None else shutil.which("nvidia-smi")
        self.done = threading.Event()
        self.use = {"every": self.every, "step": self.every, "per": 1, "points": []}
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.done.set()

    def _gpus(self):
        if not self.smi:
            return []
        try:
            done = subprocess.run([self.smi, *GPU_QUERY], capture_output=True, text=True,
                                  timeout=SMI_TIMEOUT, check=False)
        except (OSError, subprocess.SubprocessError):
            return []
        return parse_gpu_use(done.stdout) if done.returncode == 0 else []

    def sample(self, before):
        """One point, and the CPU times it was measured to."""
        now_cpu = cpu_times(self.proc)
        used, total = memory(self.proc)
        gpus = self._gpus()
        if gpus and "gpus" not in self.use:
            self.use["gpus"] = [g[0] for g in gpus]
            self.use["gpu_memory_total_mib"] = [g[3] for g in gpus]
        if total is not None:
            self.use["memory_total_mib"] = round(total)
        by_index = {g[0]: g for g in gpus}
        point = [round(time.time(), 2), 1, busy_percent(before, now_cpu),
                 None if used is None else round(used),
                 [[by_index[i][1], by_index[i][2]] if i in by_index else [None, None]
                  for i in self.use.get("gpus") or []]]
        return point, now_cpu

    def _run(self):
        before = cpu_times(self.proc)
        # The first sample a second after the launcher's start (the CPU's share needs two
        # looks): a job of any length has one, and the tables show the same columns each run.
        wait = min(self.every, FIRST)
        while not self.done.wait(wait):
            wait = self.every
            point, before = self.sample(before)
            self.use = add(self.use, point)
            try:
                self.write(self.use)
            except OSError:
                pass  # a full disk: the job goes on, the next sample tries again
