"""Per-node progress from ansible-runner events: node, rank, phase, state, last word."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table

# Play names of the launch playbook are the phases of the data flow.
_PHASE_OF_TASK = {
    "Gather node facts": "preflight", "Compare the nodes": "preflight",
    "Sync the code": "sync", "Start torchrun on every node": "start",
    "Wait for the job": "watch", "Fetch the node's run directory": "collect",
}


class Progress:
    def __init__(self) -> None:
        self.rows: dict[str, dict[str, str]] = {}
        self.phase = "plan"

    def _row(self, host: str) -> dict[str, str]:
        return self.rows.setdefault(host, {"rank": "", "phase": self.phase, "state": "",
                                           "note": ""})

    def update(self, event: dict[str, Any]) -> str | None:
        """Fold one event in; return a line for plain (non-terminal) output, if worth one."""
        kind = event.get("event", "")
        data = event.get("event_data", {})
        host = data.get("host")
        task = (data.get("task") or "").split(" : ")[-1]
        if kind == "playbook_on_task_start" and task in _PHASE_OF_TASK:
            phase = _PHASE_OF_TASK[task]
            if phase != self.phase:
                self.phase = phase
                return f"torchherd: {phase}"
            return None
        if not host or host == "localhost":
            return None
        row = self._row(host)
        res = data.get("res") or {}
        row["phase"] = _PHASE_OF_TASK.get(task, row["phase"])
        if kind == "runner_on_unreachable":
            row["state"], row["note"] = "unreachable", str(res.get("msg", ""))[:80]
            return f"torchherd: {host}: unreachable: {row['note']}"
        if kind == "runner_on_failed" and not data.get("ignore_errors"):
            row["state"], row["note"] = "failed", str(res.get("msg", ""))[:80]
            return f"torchherd: {host}: {task} failed"
        if kind == "runner_on_ok":
            if "job_state" in res:
                row["state"] = res["job_state"]
                row["note"] = res.get("last_line", "")[:80]
                if res.get("meta", {}).get("node_rank") is not None:
                    row["rank"] = str(res["meta"]["node_rank"])
            elif row["state"] in ("", "ok"):
                row["state"] = "ok"
        return None

    def table(self) -> Table:
        table = Table(title=f"torchherd: {self.phase}", title_justify="left")
        for col in ("node", "rank", "phase", "state", "last line"):
            table.add_column(col, overflow="ellipsis", no_wrap=True)
        for host, row in self.rows.items():
            table.add_row(host, row["rank"], row["phase"], row["state"], escape(row["note"]))
        return table
