"""prune: old runs' directories removed, on the controller and on their nodes; the policy
(driver.prune) applied, the nodes asked through the prune playbook."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from driver.actions import runs
from driver.inputs import inventory_source
from driver.outcomes import first_message
from driver.prune import (
    PrunedRun,
    PruneReport,
    busy_hold,
    controller_only_hold,
    elsewhere_hold,
    nodes_hold,
    select,
    size_of,
)
from driver.prune import verdict as prune_verdict
from driver.result import DRIVER_FILE, Exit, read_json
from driver.runner import Event, Outcome, run_playbook

PRUNE_MODULE = "torchherd.cluster.prune_runs"  # whose answers the prune reads from events


def _ask_nodes(targets: dict[str, list[dict[str, str]]], inventory: str, remove: bool,
               on_event: Callable[[Event], None] | None, verbosity: int,
               ) -> tuple[dict[str, dict[str, dict[str, Any]]], set[str], Outcome]:
    """The prune playbook on the nodes: run id -> host -> prune_runs' answer for the run (or
    ``no_answer``: why the node said nothing), and the hosts of ``targets`` that the inventory
    has (the playbook's first play names them)."""
    answers: dict[str, dict[str, dict[str, Any]]] = {}
    present: set[str] = set()

    def seen(event: Event) -> None:
        data = event.get("event_data") or {}
        action = data.get("resolved_action") or data.get("task_action")
        if action == "ansible.builtin.add_host" and event.get("event") == "runner_item_on_ok":
            present.add(((data.get("res") or {}).get("add_host") or {}).get("host_name"))
        if action == PRUNE_MODULE:
            host, res, kind = data.get("host", ""), data.get("res") or {}, event.get("event")
            if kind == "runner_on_ok":
                for run_id, entry in (res.get("runs") or {}).items():
                    answers.setdefault(run_id, {})[host] = entry
            elif kind in ("runner_on_failed", "runner_on_unreachable"):
                why = "unreachable" if kind == "runner_on_unreachable" else "failed"
                for run in targets.get(host, []):
                    answers.setdefault(run["run_id"], {})[host] = {
                        "no_answer": f"{why}: {str(res.get('msg') or '').strip()[:300]}"}
        if on_event:
            on_event(event)

    outcome = run_playbook("prune", inventory, {"torchherd_prune": targets,
                                                "torchherd_prune_remove": remove},
                           on_event=seen, verbosity=verbosity)
    return answers, present, outcome


def launched_with(run_dir: Path) -> str | None:
    """The inventory a run was launched with (its driver.json), if the driver launched it."""
    return (read_json(run_dir / DRIVER_FILE) or {}).get("inventory")


def prune(runs_dir: str | Path | None = None, *, keep: int | None = None,
          older_than: float | None = None, inventory: str | Path | None = None,
          remove: bool = False, on_event: Callable[[Event], None] | None = None,
          verbosity: int = 0, now: float | None = None) -> PruneReport:
    """Remove the directories of old runs: all but the newest ``keep``, and/or those started
    more than ``older_than`` seconds ago (see driver.prune.select); ``remove=False`` (the
    default) removes nothing and reports what would go.

    With ``inventory``, each run's directory on its nodes (``<root>/runs/<run_id>``) goes too,
    through the prune playbook, and a run goes only where every node of its plan answered and
    none runs its job. Without one, only the controller's directories go, and a run whose
    record says it may still run stays.
    """
    now = time.time() if now is None else now
    chosen = select(runs(runs_dir), keep, older_than, now)
    report = PruneReport(dry_run=not remove, keep=keep, older_than=older_than,
                         nodes_asked=inventory is not None,
                         runs=[PrunedRun(r.run_id, r.run_dir, r.state, r.started_at)
                               for r in chosen])
    nodes = {r.run_id: (read_json(r.run_dir / "plan.json") or {}).get("nodes") or []
             for r in chosen}
    hosts = {run_id: [n["host"] for n in planned] for run_id, planned in nodes.items()}
    holds = {r.run_id: busy_hold(r, now) or (None if inventory else controller_only_hold(r))
             for r in chosen}
    if inventory is not None:
        source = inventory_source(inventory)
        answers: dict[str, dict[str, dict[str, Any]]] = {}
        # Ask first (check mode), so that a run whose job runs on one node stays on all.
        for remove_now in (False, True) if remove else (False,):
            targets: dict[str, list[dict[str, str]]] = {}
            for run in chosen:
                if holds[run.run_id] is None:
                    for node in nodes[run.run_id]:
                        targets.setdefault(node["host"], []).append(
                            {"run_id": run.run_id, "root": node["root"]})
            if not targets:
                break
            asked, present, outcome = _ask_nodes(targets, source, remove_now, on_event,
                                                 verbosity)
            if not asked and outcome.rc != 0:
                report.exit_code, report.reason = Exit.ERROR, first_message(outcome)
                for entry in report.runs:
                    entry.kept = f"the nodes could not be asked: {report.reason}"
                return report
            answers.update(asked)
            for run in chosen:
                if holds[run.run_id] is None:
                    holds[run.run_id] = (
                        elsewhere_hold(hosts[run.run_id], present, launched_with(run.run_dir))
                        or nodes_hold(hosts[run.run_id], asked.get(run.run_id, {})))
        for entry in report.runs:
            entry.nodes = answers.get(entry.run_id, {})
    for entry in report.runs:
        entry.bytes, entry.files = size_of(entry.run_dir)
        hold = holds[entry.run_id]
        if hold is not None:
            entry.kept = hold[1]
            continue
        if remove:
            try:
                shutil.rmtree(entry.run_dir)
            except OSError as exc:  # the nodes' copies are gone: say what is left here
                entry.kept = f"not removed on the controller: {exc}"
                holds[entry.run_id] = (Exit.ERROR, entry.kept)
                continue
        entry.removed = True
    report.exit_code, report.reason = prune_verdict([h for h in holds.values() if h])
    return report
