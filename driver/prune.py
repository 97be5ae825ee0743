"""Which past runs ``torchherd runs --prune`` removes, and what removing them came to.

Pure parts (the keep policy, durations, the per-run decision from the nodes' answers) live
here and are unit-tested; driver.pruner.prune does the I/O: the prune playbook on the nodes, the
run directories on the controller.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver.result import Exit, RunInfo, UsageError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
# States a run's controller record may hold while its job still runs on the nodes: a detached
# job ("running"), or a launch in progress or killed before its summary ("unknown").
MAY_RUN = ("running", "unknown")
# A run directory written this recently may belong to a launch still in its preflight or sync,
# when no node shows a job yet: never pruned.
BUSY_SECONDS = 600.0


def parse_duration(text: str) -> float:
    """Seconds in ``7d``, ``12h``, ``30m``, ``90s``, ``2w`` or a sum of them (``1d12h``)."""
    value = text.strip().lower()
    parts = _DURATION.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise UsageError(f"--older-than {text!r}: expected a duration such as 7d, 12h, 30m, "
                         f"90s, 2w or 1d12h")
    return float(sum(float(n) * _UNITS[u] for n, u in parts))


def select(runs: list[RunInfo], keep: int | None, older_than: float | None,
           now: float) -> list[RunInfo]:
    """The runs a keep policy lets go, oldest first. ``keep``: the newest ``keep`` runs stay;
    ``older_than``: runs started less than that many seconds ago stay. With both, a run goes
    only where both let it go (either one keeps it). A run without a start time is the oldest
    for ``keep`` and of unknown age (kept) for ``older_than``."""
    if keep is None and older_than is None:
        raise UsageError("runs --prune: expected a keep policy, found none; give --keep N "
                         "(keep the N newest runs) and/or --older-than DURATION (e.g. 7d)")
    if keep is not None and keep < 0:
        raise UsageError(f"--keep {keep}: expected 0 or more runs to keep")
    ordered = sorted(runs, key=lambda r: (r.started_at or 0.0, r.run_id))
    chosen = ordered[:max(0, len(ordered) - keep)] if keep is not None else ordered
    if older_than is not None:
        chosen = [r for r in chosen if r.started_at is not None
                  and now - r.started_at > older_than]
    return chosen


def size_of(top: Path) -> tuple[int, int]:
    """(bytes, files) under a directory, symlinks counted as themselves, never followed.
    (The prune_runs module counts the same on the nodes; the driver imports nothing of the
    collection.)"""
    total = count = 0
    for dirpath, _dirnames, filenames in os.walk(top):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            count += 1
    return total, count


def last_written(run_dir: Path) -> float:
    """When anything directly in the run directory last changed."""
    times = [p.lstat().st_mtime for p in [run_dir, *run_dir.iterdir()]] \
        if run_dir.is_dir() else []
    return max(times, default=0.0)


@dataclass
class PrunedRun:
    """One run the policy let go, and what became of it."""

    run_id: str
    run_dir: Path
    state: str
    started_at: float | None
    removed: bool = False  # in a dry run: would be removed
    kept: str | None = None  # why it stays, where it does
    bytes: int = 0  # on the controller
    files: int = 0
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)  # host: prune_runs' answer

    @property
    def node_bytes(self) -> int:
        return sum(int(n.get("bytes") or 0) for n in self.nodes.values() if n.get("removed"))

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "run_dir": str(self.run_dir), "state": self.state,
                "started_at": self.started_at, "removed": self.removed, "kept": self.kept,
                "bytes": self.bytes, "files": self.files,
                "nodes": {h: {"state": n.get("state"), "removed": n.get("removed"),
                              "bytes": n.get("bytes"), "files": n.get("files"),
                              "error": n.get("error") or n.get("no_answer")}
                          for h, n in self.nodes.items()}}


@dataclass
class PruneReport:
    """What ``runs --prune`` removed (``dry_run``: would remove), per run and in total."""

    dry_run: bool
    keep: int | None
    older_than: float | None
    nodes_asked: bool  # False without an inventory: the controller's directories only
    runs: list[PrunedRun]
    exit_code: Exit = Exit.OK
    reason: str = ""

    def totals(self) -> dict[str, int]:
        gone = [r for r in self.runs if r.removed]
        return {"runs": len(gone), "kept": len(self.runs) - len(gone),
                "bytes": sum(r.bytes for r in gone),
                "node_dirs": sum(1 for r in gone for n in r.nodes.values() if n.get("removed")),
                "node_bytes": sum(r.node_bytes for r in gone)}

    def to_dict(self) -> dict[str, Any]:
        """The ``runs --prune --json`` document (driver/schema.json, prune)."""
        return {"action": "prune", "dry_run": self.dry_run, "keep": self.keep,
                "older_than": self.older_than, "nodes_asked": self.nodes_asked,
                "runs": [r.to_dict() for r in self.runs], "totals": self.totals(),
                "exit_code": int(self.exit_code), "exit_name": self.exit_code.name.lower(),
                "reason": self.reason}


# Why a run stays: the exit code it amounts to (OK where staying is right) and the words.
Hold = tuple[Exit, str]


def controller_only_hold(run: RunInfo) -> Hold | None:
    """Why a run stays when its nodes cannot be asked (no inventory), or None."""
    if run.state in MAY_RUN:
        return Exit.OK, (f"its record says {run.state} and its nodes were not asked; give "
                         f"-i INVENTORY to ask them")
    return None


def elsewhere_hold(planned: list[str], present: set[str],
                   launched_with: str | None) -> Hold | None:
    """Why a run whose nodes are not all in the inventory given stays: not an error (another
    inventory's run, which this one cannot reach), said with the inventory it ran on. None
    where every node of the run is in it."""
    missing = [h for h in planned if h not in present]
    if not missing:
        return None
    where = f"-i {launched_with}" if launched_with else "the inventory it ran on"
    return Exit.OK, (f"its nodes {', '.join(missing)} are not in this inventory: prune it "
                     f"with {where}")


def nodes_hold(planned: list[str], answers: dict[str, dict[str, Any]]) -> Hold | None:
    """Why a run stays, from its nodes' answers (prune_runs' entry of the run, or a
    ``no_answer`` note), or None when no node runs it and every node answered."""
    running = [h for h in planned if (answers.get(h) or {}).get("state") == "running"]
    if running:
        return Exit.OK, f"its job runs on {', '.join(running)}"
    silent = [f"{h} ({(answers.get(h) or {}).get('no_answer') or 'no answer'})"
              for h in planned if not answers.get(h) or answers[h].get("no_answer")]
    if silent:
        return Exit.NODE_UNREACHABLE, f"no answer from {', '.join(silent)}"
    failed = [f"{h} ({answers[h]['error']})" for h in planned if answers[h].get("error")]
    if failed:
        return Exit.ERROR, f"not removed on {', '.join(failed)}"
    return None


def busy_hold(run: RunInfo, now: float) -> Hold | None:
    """Why a run without a summary that was written to a moment ago stays (see BUSY_SECONDS),
    or None."""
    if run.state != "unknown":
        return None
    age = now - last_written(run.run_dir)
    if age < BUSY_SECONDS:
        return Exit.OK, f"written to {age:.0f} s ago: an action may be using it"
    return None


def verdict(holds: list[Hold]) -> tuple[Exit, str]:
    """The exit code and reason of a prune from why runs stayed: a node that did not answer
    first (the run stays everywhere until it does), then a removal that failed."""
    for code in (Exit.NODE_UNREACHABLE, Exit.ERROR):
        found = [text for c, text in holds if c == code]
        if found:
            return code, f"kept {len(found)} run(s): {found[0]}" + (
                f" (and {len(found) - 1} more)" if len(found) > 1 else "")
    return Exit.OK, ""
