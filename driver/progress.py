"""Per-node progress from ansible-runner events: node, rank, phase, state, last log line.

Phases carry the names of the data flow (plan, preflight, sync, firewall, start, watch,
collect, teardown, summary) and of the run actions (status, stop). They come from what every
event carries as Ansible's contract, never from task or play display names: the module a task
runs and the role it belongs to (see PHASES). Only chosen fields of a result are read, so that
nothing it shows can carry a secret value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from rich.markup import escape
from rich.table import Table

from driver.logs import parse_line

# The contract between the collection and this view: the module that does each phase's work,
# as Ansible reports it in every task's events (resolved_action, its FQCN, whatever the task
# is called). Where one module serves several phases, the role's task file it is called from
# ("role/file", the file named in task_path) or else its role ("" for a playbook's own task)
# tells which. task_args cannot tell a module's state apart: it is empty unless
# display_args_to_stdout is set, and censored under no_log. Tasks of other modules (set_fact,
# assert, includes) keep the phase they run in. Renaming a role, a role's task file or a
# module of this table changes the contract: change it here too.
PHASES: dict[str, str | dict[str, str]] = {
    "torchherd.cluster.code_hash": "plan",
    "torchherd.cluster.run_record": {"plan": "plan", "preflight": "preflight"},
    "torchherd.cluster.node_facts": "preflight",
    "torchherd.cluster.tcp_probe": "preflight",
    "torchherd.cluster.interconnect": "interconnect",
    "torchherd.cluster.job_stacks": "stacks",
    "torchherd.cluster.rsync": {"sync": "sync", "collect": "collect"},
    "torchherd.cluster.firewall_rules": {"firewall": "firewall", "firewall/teardown": "teardown",
                                         "firewall/teardown_all": "teardown"},
    "torchherd.cluster.torchrun_job": {"torchrun/start": "start", "torchrun/wait": "watch",
                                       "torchrun/stop": "stop", "torchrun/stop_all": "stop",
                                       "": "status"},
    "torchherd.cluster.run_summary": "summary",
}
# What a node's successful result of a phase's module means for its row.
_DONE = {("torchherd.cluster.node_facts", "preflight"): "checked",
         ("torchherd.cluster.rsync", "sync"): "synced"}
_STATE_STYLE = {"succeeded": "green", "running": "cyan", "failed": "red", "lost": "red",
                "unreachable": "red", "timed_out": "red", "preflight failed": "red",
                "stopped": "yellow"}
_NOTE_WIDTH = 100


@dataclass
class Row:
    rank: str = ""
    phase: str = ""
    state: str = ""
    note: str = ""


def module_of(data: dict[str, Any]) -> str:
    """The FQCN of the module an event's task runs (as written, where Ansible resolved none)."""
    return data.get("resolved_action") or data.get("task_action") or ""


def phase_of(data: dict[str, Any], current: str) -> str:
    """The phase of the task an event belongs to (see PHASES); ``current`` for other tasks."""
    phases = PHASES.get(module_of(data), current)
    if isinstance(phases, str):
        return phases
    role = data.get("role") or ""
    if not role:
        return phases.get("", current)
    task_file = PurePath(str(data.get("task_path") or "").rsplit(":", 1)[0]).stem
    return phases.get(f"{role}/{task_file}") or phases.get(role) or current


def _first_line(value: Any) -> str:
    text = str(value or "").strip()
    return text.splitlines()[0][:_NOTE_WIDTH] if text else ""


class Progress:
    """Fold ansible-runner events into one row per node; render a table or plain lines."""

    def __init__(self, title: str = "torchherd") -> None:
        self.title = title
        self.rows: dict[str, Row] = {}
        self.phase = ""
        self.nproc: int | None = None
        self.static = True  # global rank = node_rank * nproc + local rank (static rendezvous)

    def _row(self, host: str) -> Row:
        return self.rows.setdefault(host, Row(phase=self.phase))

    def _note(self, host: str, line: str) -> str:
        row = self.rows.get(host)
        node_rank = int(row.rank) if row and row.rank.isdigit() else None
        nproc = self.nproc if self.static else None
        return _first_line(parse_line(host, node_rank, nproc, line).short)

    def _enter(self, phase: str) -> list[str]:
        if phase == self.phase:
            return []
        self.phase = phase
        return [f"torchherd: {phase}"]

    def _set(self, host: str, phase: str, state: str | None = None,
             note: str | None = None) -> str | None:
        row = self._row(host)
        row.phase = phase or row.phase
        changed = state is not None and state != row.state
        if state is not None:
            row.state = state
        if note is not None:
            row.note = note
        if not changed:
            return None
        rank = f" (node_rank {row.rank})" if row.rank else ""
        detail = f": {row.note}" if row.note and state not in ("ok", "checked", "synced") else ""
        return f"torchherd: {host}{rank}: {row.state}{detail}"

    def update(self, event: dict[str, Any]) -> list[str]:
        """Fold one event in; return the lines worth printing when there is no live table."""
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        # Every playbook of the collection begins with the plan: its own, or the run's read back.
        if kind == "playbook_on_start":
            return self._enter("plan")
        phase = phase_of(data, self.phase)
        if kind == "playbook_on_task_start":
            return self._enter(phase)
        host = data.get("host")
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        if not host:
            return []
        if host == "localhost":
            return self._controller(kind, phase, res)
        if kind == "runner_on_unreachable":
            return _some(self._set(host, phase, "unreachable", _first_line(res.get("msg"))))
        # A watch that ends in a failed job fails its task on purpose (the gang stop is its
        # rescue): the job's own state and last line say more than the task's message. A fail
        # task restates what was found before, on whichever host it runs (the gate's verdict
        # runs once, for all): the rows hold that already.
        if (kind == "runner_on_failed" and not data.get("ignore_errors")
                and "job_state" not in res):
            if module_of(data) == "ansible.builtin.fail":
                return []
            return _some(self._set(host, phase, "failed", _first_line(res.get("msg"))))
        if kind not in ("runner_on_ok", "runner_retry") and "job_state" not in res:
            return []
        if res.get("unreachable"):  # ignore_unreachable results arrive as ok
            return _some(self._set(host, phase, "unreachable", _first_line(res.get("msg"))))
        if "job_state" in res:
            meta = res.get("meta") or {}
            if meta.get("node_rank") is not None:
                self._row(host).rank = str(meta["node_rank"])
            return _some(self._set(host, phase, res["job_state"],
                                   self._note(host, res.get("last_line") or "")))
        gate = (res.get("ansible_facts") or {}).get("torchherd_gate")
        if gate:
            return self._gate(gate, phase)
        done = _DONE.get((module_of(data), phase))
        return _some(self._set(host, phase, done)) if done and kind == "runner_on_ok" else []

    def _controller(self, kind: str, phase: str, res: dict[str, Any]) -> list[str]:
        plan = (res.get("ansible_facts") or {}).get("torchherd_plan")
        if kind == "runner_on_ok" and isinstance(plan, dict):
            self.static = (plan.get("job") or {}).get("rdzv", "static") == "static"
            if isinstance(plan.get("nproc_per_node"), int):
                self.nproc = plan["nproc_per_node"]
        elif kind == "runner_item_on_ok" and "add_host" in res:
            added = res["add_host"]
            row = self._row(added.get("host_name", ""))
            node = (added.get("host_vars") or {}).get("torchherd_node") or {}
            row.rank = str(node.get("node_rank", "")) if isinstance(node, dict) else ""
            row.state = row.state or "planned"
        elif kind == "runner_on_ok" and phase == "summary" and "summary" in res:
            summary = res.get("summary") or {}
            if isinstance(summary.get("nproc_per_node"), int):
                self.nproc = summary["nproc_per_node"]
            lines = []
            for host, h in (summary.get("hosts") or {}).items():
                self._row(host).rank = str(h.get("node_rank", ""))
                note = h.get("exception") or h.get("error") or self._note(
                    host, h.get("last_line") or "")
                lines += _some(self._set(host, phase, h.get("state"), _first_line(note)))
            return lines
        return []

    def _gate(self, gate: dict[str, Any], phase: str) -> list[str]:
        if isinstance(gate.get("nproc_per_node"), int):
            self.nproc = gate["nproc_per_node"]
        lines = []
        for problem in gate.get("problems") or []:
            for host in str(problem.get("host", "")).split(", "):
                if host in self.rows:
                    note = f"{problem.get('check')}: found {problem.get('found')}"
                    lines += _some(self._set(host, phase, "preflight failed", _first_line(note)))
        return lines

    def table(self) -> Table:
        table = Table(title=f"{self.title}: {self.phase}", title_justify="left")
        for col in ("node", "rank", "phase", "state", "last line"):
            table.add_column(col, overflow="ellipsis", no_wrap=True)
        for host, row in self.rows.items():
            style = _STATE_STYLE.get(row.state)
            state = f"[{style}]{escape(row.state)}[/]" if style else escape(row.state)
            table.add_row(escape(host), row.rank, row.phase, state, escape(row.note))
        return table


def _some(line: str | None) -> list[str]:
    return [line] if line else []
