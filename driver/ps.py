"""``torchherd ps``: who uses the nodes of an inventory. Every node is asked at once, one task
each (the ps playbook, module node_runs), for the torchherd runs on it, whoever launched them
and from whichever controller, and for the GPU processes that are none of theirs. A node that
does not answer is named with why."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from driver.inputs import inventory_source
from driver.outcomes import first_message
from driver.result import Exit
from driver.runner import Event, run_playbook

PS_MODULE = "torchherd.cluster.node_runs"  # whose answers ps reads from the events


@dataclass
class NodeUse:
    """One node's answer: its runs and foreign GPU processes (node_runs' RETURN), or why it
    gave none (``no_answer``)."""

    host: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    gpu_processes: list[dict[str, Any]] | None = None
    sees_all: bool | None = None
    no_answer: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "gpu_processes": self.gpu_processes,
                "sees_all": self.sees_all, "no_answer": self.no_answer}


@dataclass
class PsReport:
    """What ``ps`` found, node by node in the inventory's order."""

    nodes: dict[str, NodeUse]
    checked_at: float
    exit_code: Exit = Exit.OK
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The ``ps --json`` document (driver/schema.json, ps)."""
        return {"action": "ps", "checked_at": self.checked_at,
                "nodes": {h: n.to_dict() for h, n in self.nodes.items()},
                "exit_code": int(self.exit_code), "exit_name": self.exit_code.name.lower(),
                "reason": self.reason}


def no_answer(kind: str, res: dict[str, Any]) -> str:
    """Why a node gave no answer, from its failed or unreachable event: unreachable (SSH's
    words), or the module could not run (no Python there: the interpreter's words)."""
    # ansible-core puts "Task failed: " in front of what went wrong.
    msg = " ".join(str(res.get("msg") or res.get("module_stderr") or "").split())
    msg = msg.removeprefix("Task failed: ")[:300]
    if kind == "runner_on_unreachable":
        return f"unreachable: {msg}"
    stderr = " ".join(str(res.get("module_stderr") or "").split())
    if "not found" in stderr or "No such file" in stderr or res.get("rc") == 127:
        return f"no python: {stderr[:300] or msg}"
    return f"failed: {msg}"


def answer(node: NodeUse, kind: str, res: dict[str, Any]) -> None:
    """One event of the node_runs task into the node's entry."""
    if kind == "runner_on_ok":
        node.runs = list(res.get("runs") or [])
        node.gpu_processes = res.get("gpu_processes")
        node.sees_all = res.get("sees_all")
        node.no_answer = None
    elif kind in ("runner_on_failed", "runner_on_unreachable"):
        node.no_answer = no_answer(kind, res)


def shared_machines(nodes: dict[str, NodeUse]) -> None:
    """Each run once: nodes of one machine (local nodes, several inventory names for one host)
    all see its runs; a run whose plan names another node of the inventory that found the same
    run directory is that node's row alone."""
    seen = {(n.host, run["run_dir"]) for n in nodes.values() for run in n.runs}
    for node in nodes.values():
        node.runs = [run for run in node.runs
                     if run.get("host") in (None, node.host) or run.get("host") not in nodes
                     or (run["host"], run["run_dir"]) not in seen]


def verdict(nodes: dict[str, NodeUse]) -> tuple[Exit, str]:
    """ps' exit code and reason: as status, a node that did not answer is node_unreachable."""
    silent = [f"{h} ({n.no_answer})" for h, n in nodes.items() if n.no_answer]
    if silent:
        return Exit.NODE_UNREACHABLE, f"no answer from {', '.join(silent)}"
    return Exit.OK, ""


def ps(inventory: str | Path, *, on_event: Callable[[Event], None] | None = None,
       verbosity: int = 0) -> PsReport:
    """Ask every node of ``inventory`` (all its hosts, within the limit of -l) who uses it:
    the torchherd runs there (run id, job name, user, node rank, GPUs held, since when, state)
    and the GPU processes that are none of theirs (pid, user, memory)."""
    nodes: dict[str, NodeUse] = {}

    def seen(event: Event) -> None:
        data = event.get("event_data") or {}
        action = data.get("resolved_action") or data.get("task_action")
        kind = event.get("event") or ""
        if action == PS_MODULE and data.get("host"):
            node = nodes.setdefault(data["host"], NodeUse(data["host"]))
            if kind == "runner_on_start":
                node.no_answer = node.no_answer or "no answer"
            answer(node, kind, data.get("res") or {})
        if on_event:
            on_event(event)

    outcome = run_playbook("ps", inventory_source(inventory), {}, on_event=seen,
                           verbosity=verbosity)
    report = PsReport(nodes, time.time())
    if not nodes and outcome.rc != 0:
        report.exit_code, report.reason = Exit.ERROR, first_message(outcome)
        return report
    shared_machines(nodes)
    report.exit_code, report.reason = verdict(nodes)
    return report
