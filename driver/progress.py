"""Per-node progress from ansible-runner events: node, rank, phase, state, last log line.

Phases carry the names of the data flow (plan, preflight, sync, start, watch, collect) and of
the run actions (status, stop); they come from the roles and plays that the events name. Only
chosen fields of a result are read: some results (the plan's set_fact) hold secret values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.markup import escape
from rich.table import Table

from driver.logs import parse_line

# The torchrun role serves start, watch and stop, told apart by the play.
_ROLE_PHASE = {"plan": "plan", "preflight": "preflight", "sync": "sync", "firewall": "firewall",
               "collect": "collect"}
_PLAY_PHASE = {"plan": "plan", "load the run": "plan", "watch": "watch", "collect": "collect",
               "summary": "summary", "status": "status", "stop": "stop", "preflight": "preflight"}
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


def phase_of(play: str, role: str, current: str) -> str:
    """The data-flow phase of a task, from its play or else its role (the launch's first play
    holds preflight, sync and start); ``current`` for tasks of neither (the phase marks)."""
    play = play.lower()
    if play in _PLAY_PHASE:
        return _PLAY_PHASE[play]
    if role == "torchrun":
        return "start"
    return _ROLE_PHASE.get(role, current)


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

    def _set(self, host: str, state: str | None = None, note: str | None = None) -> str | None:
        row = self._row(host)
        row.phase = self.phase or row.phase
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
        task = data.get("task") or ""
        if kind in ("playbook_on_play_start", "playbook_on_task_start"):
            phase = phase_of(data.get("play") or "", data.get("role") or "", self.phase)
            if phase != self.phase:
                self.phase = phase
                return [f"torchherd: {phase}"]
            return []
        host = data.get("host")
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        if not host:
            return []
        if host == "localhost":
            return self._controller(kind, task, res)
        if kind == "runner_on_unreachable":
            return _some(self._set(host, "unreachable", _first_line(res.get("msg"))))
        # A watch that ends in a failed job fails its task on purpose (the gang stop is its
        # rescue): the job's own state and last line say more than the task's message.
        if (kind == "runner_on_failed" and not data.get("ignore_errors")
                and "job_state" not in res):
            if task == "Stop before anything starts":  # the gate's verdict, not this host's
                return []
            return _some(self._set(host, "failed", _first_line(res.get("msg"))))
        if kind not in ("runner_on_ok", "runner_retry") and "job_state" not in res:
            return []
        if res.get("unreachable"):  # ignore_unreachable results arrive as ok
            return _some(self._set(host, "unreachable", _first_line(res.get("msg"))))
        if "job_state" in res:
            meta = res.get("meta") or {}
            if meta.get("node_rank") is not None:
                self._row(host).rank = str(meta["node_rank"])
            return _some(self._set(host, res["job_state"],
                                   self._note(host, res.get("last_line") or "")))
        gate = (res.get("ansible_facts") or {}).get("torchherd_gate")
        if gate:
            return self._gate(gate)
        if task == "Gather node facts":
            return _some(self._set(host, "checked"))
        if task == "Sync the code":
            return _some(self._set(host, "synced"))
        return []

    def _controller(self, kind: str, task: str, res: dict[str, Any]) -> list[str]:
        plan = (res.get("ansible_facts") or {}).get("torchherd_plan")
        if kind == "runner_on_ok" and isinstance(plan, dict):
            self.static = (plan.get("job") or {}).get("rdzv", "static") == "static"
            if isinstance(plan.get("nproc_per_node"), int):
                self.nproc = plan["nproc_per_node"]
        elif kind == "runner_item_on_ok" and "add_host" in res:
            added = res["add_host"]
            row = self._row(added.get("host_name", ""))
            row.rank = str((added.get("host_vars") or {}).get("torchherd_node_rank", ""))
            row.state = row.state or "planned"
        elif kind == "runner_on_ok" and task == "Write summary.json":
            summary = res.get("summary") or {}
            if isinstance(summary.get("nproc_per_node"), int):
                self.nproc = summary["nproc_per_node"]
            lines = []
            for host, h in (summary.get("hosts") or {}).items():
                self._row(host).rank = str(h.get("node_rank", ""))
                note = h.get("exception") or h.get("error") or self._note(
                    host, h.get("last_line") or "")
                lines += _some(self._set(host, h.get("state"), _first_line(note)))
            return lines
        return []

    def _gate(self, gate: dict[str, Any]) -> list[str]:
        if isinstance(gate.get("nproc_per_node"), int):
            self.nproc = gate["nproc_per_node"]
        lines = []
        for problem in gate.get("problems") or []:
            for host in str(problem.get("host", "")).split(", "):
                if host in self.rows:
                    note = f"{problem.get('check')}: found {problem.get('found')}"
                    lines += _some(self._set(host, "preflight failed", _first_line(note)))
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
