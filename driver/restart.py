"""Whole-job restarts: after a failure of a kind the job's ``restart_on`` names, the driver
leaves the failed node out and launches the run id again (the launch playbook, with
``torchherd_restart`` and ``torchherd_exclude``); a spare takes the node's rank.

The summary says what failed (``cause``, the node a failure is laid to, and ``cause_kind``:
node_lost, connection, signal or exception); the launch's schedule (schedule.json, its
``restart``) says whether a restart is left and on which kinds. This module acts on the two and
keeps the record of each incident.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

# What stays at the top of the run directory across restarts: the driver's own note.
_KEEP = {"restarts", "driver.json"}


def incident(summary: dict[str, Any], schedule: dict[str, Any]) -> dict[str, Any] | None:
    """The incident a failed launch's summary amounts to, where its schedule lets the run
    restart on it (restarts left, the kind among those it answers); None otherwise."""
    policy = schedule.get("restart") or {}
    if summary.get("state") != "failed" or not policy.get("left"):
        return None
    kind = summary.get("cause_kind")
    if kind not in (policy.get("on") or []):
        return None
    restart = int(policy.get("this") or 0)
    node = summary.get("cause")
    entry = (summary.get("hosts") or {}).get(node) or {}
    # A lost node has no end: the moment the master's gang saw its link close.
    at = entry.get("ended_at") or entry.get("lost_at") or summary.get("written_at") or time.time()
    return {
        "restart": restart + 1, "at": at, "kind": kind,
        # An exception of the job's own code is no node's fault: none is left out for it.
        "node": None if kind == "exception" else node,
        "node_rank": entry.get("node_rank"), "why": summary.get("reason") or "",
        "replaced_by": None, "first_output_after": None,
    }


def settle(incidents: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    """Fill in the last incident from the summary of the launch that answered it: the node that
    now holds the lost node's rank, and seconds from the failure to the first output."""
    if not incidents:
        return
    last = incidents[-1]
    hosts = summary.get("hosts") or {}
    if last["node"] is not None and last["node_rank"] is not None:
        last["replaced_by"] = next((h for h, e in hosts.items()
                                    if e.get("node_rank") == last["node_rank"]
                                    and h != last["node"]), None)
    first = [e["first_output_at"] for e in hosts.values()
             if isinstance(e.get("first_output_at"), (int, float))]
    if first:
        last["first_output_after"] = round(min(first) - float(last["at"]), 3)


def keep_attempt(run_dir: Path, restart: int) -> Path:
    """Move what the launch before restart ``restart`` wrote into restarts/<restart - 1>, so
    that the launch again claims a fresh run directory and nothing is lost."""
    kept = run_dir / "restarts" / str(restart - 1)
    kept.mkdir(parents=True, exist_ok=True)
    for entry in run_dir.iterdir():
        if entry.name not in _KEEP:
            os.replace(entry, kept / entry.name)
    return kept


def restore_attempt(run_dir: Path, restart: int) -> None:
    """Undo keep_attempt where restart ``restart`` could not even be planned: the failed
    launch's records are the run's again."""
    kept = run_dir / "restarts" / str(restart - 1)
    if not kept.is_dir():
        return
    for entry in kept.iterdir():
        if not (run_dir / entry.name).exists():
            os.replace(entry, run_dir / entry.name)
    with contextlib.suppress(OSError):
        kept.rmdir()
        (run_dir / "restarts").rmdir()


def record(run_dir: Path, incidents: list[dict[str, Any]]) -> None:
    """The incidents into summary.json (the last launch's) as ``incidents``."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    summary["incidents"] = incidents
    part = path.with_name(f"summary.json.part.{os.getpid()}")
    part.write_text(json.dumps(summary, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(part, path)
