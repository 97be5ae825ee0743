# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""How long each phase of a run took, from the times the plays and the nodes recorded."""

from __future__ import annotations

import time

PHASES = ("plan", "preflight", "sync", "start", "watch", "collect")


def phase_timings(started_at, marks, launched_at=None, first_output_at=None, ended_at=None,
                  warm=()):
    """Seconds spent in each phase, from the times the phases ended; `launch` (the driver's
    start and ansible-playbook's, up to the plan) where the driver said when it started,
    `first_output`: from the launch (or the plan) to the first output of any rank, and
    `after_end`: from the job's end on its last node to now (the summary). Where launchers
    started ahead ran the job (`warm`: the hosts' records of them), `launcher_started` and
    `launcher_ready`: from the launch to the last of them started, and to the last of them
    done with its imports."""
    timings, last = {}, started_at
    if launched_at is not None and started_at is not None:
        timings["launch"] = round(float(started_at) - float(launched_at), 3)
    for phase in PHASES:
        if phase in marks and last is not None:
            timings[phase] = round(float(marks[phase]) - float(last), 3)
            last = marks[phase]
    origin = launched_at if launched_at is not None else started_at
    if origin is not None:
        timings["total"] = round(time.time() - float(origin), 3)
        if first_output_at is not None:
            timings["first_output"] = round(float(first_output_at) - float(origin), 3)
        used = [w for w in warm if isinstance(w, dict) and w.get("used")
                and w.get("started_at") is not None and w.get("ready_at") is not None]
        for key, at in (("launcher_started", "started_at"), ("launcher_ready", "ready_at")):
            if used:
                timings[key] = round(max(float(w[at]) for w in used) - float(origin), 3)
    if ended_at is not None:
        timings["after_end"] = round(time.time() - float(ended_at), 3)
    return timings


def phase_ends(marks, results):
    """The phases' ends: ``marks`` (the plays' own), with the sync's and the start's taken from
    the node records (node_results) where the plays left them out. The sync ended when the last
    node's copy came back (at preflight's end where no node needed one), once every node's sync
    is recorded; the start when the last node's answer came back, once every node started (at
    the sync's end where the starts came with preflight's facts calls, before it: a relaunch's
    start.with_facts)."""
    ends, nodes = dict(marks), list(results.values())
    if nodes and "preflight" in ends and "sync" not in ends \
            and all(n.get("sync") is not None for n in nodes):
        copies = [float(n["sync_ended_at"]) for n in nodes if n.get("sync_ended_at") is not None]
        ends["sync"] = max([float(ends["preflight"])] + copies)
    if nodes and "sync" in ends and "start" not in ends \
            and all(n.get("start_answered_at") is not None for n in nodes):
        ends["start"] = max([float(ends["sync"])]
                            + [float(n["start_answered_at"]) for n in nodes])
    return ends
