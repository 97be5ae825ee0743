"""Programmatic launch and result collection.

    >>> from driver import launch
    >>> run = launch({"script": "allreduce.py", "code_src": "examples"}, "inventories/local.ini")
    >>> run.ok, run.hosts["node0"]["state"]
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from driver.runner import Event, Outcome, ensure_private_umask, run_playbook
from driver.spec import validate


class Exit(IntEnum):
    """Exit codes of the CLI, also RunResult.exit_code."""

    OK = 0
    ERROR = 1
    USAGE = 2
    PREFLIGHT_FAILED = 3
    JOB_FAILED = 4
    NODE_UNREACHABLE = 5
    TIMEOUT = 6
    CANCELLED = 130


@dataclass
class RunResult:
    """One run: its id, directory on the controller, per-host results and overall verdict."""

    run_id: str
    run_dir: Path
    state: str
    exit_code: Exit
    reason: str
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.exit_code == Exit.OK

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "run_dir": str(self.run_dir), "state": self.state,
                "exit_code": int(self.exit_code), "exit_name": self.exit_code.name.lower(),
                "reason": self.reason, "hosts": self.hosts, "timings": self.timings}


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _first_message(outcome: Outcome) -> str:
    for event in outcome.failures:
        res = event.get("event_data", {}).get("res", {})
        msg = res.get("msg") or res.get("stderr") or ""
        if msg:
            host = event.get("event_data", {}).get("host", "")
            return f"{host}: {msg}" if host and host != "localhost" else str(msg)
    return f"ansible-runner ended {outcome.status} (rc {outcome.rc})"


def result_of(run_id: str, run_dir: Path, outcome: Outcome, cancelled: bool) -> RunResult:
    """Turn the run directory and the runner's outcome into a verdict with a named exit code."""
    summary = _read_json(run_dir / "summary.json")
    preflight = _read_json(run_dir / "preflight.json")
    if cancelled:
        code, state, reason = Exit.CANCELLED, "cancelled", "cancelled by the user"
    elif summary:
        state, reason = summary["state"], summary["reason"]
        hosts = summary.get("hosts", {})
        if state in ("succeeded", "running") and outcome.rc == 0:
            code = Exit.OK
        elif any(h.get("state") == "timed_out" for h in hosts.values()):
            code = Exit.TIMEOUT
        elif any(h.get("state") in ("lost", "unreachable") for h in hosts.values()):
            code = Exit.NODE_UNREACHABLE
        else:
            code = Exit.JOB_FAILED
    elif preflight and not preflight["gate"]["ok"]:
        problems = preflight["gate"]["problems"]
        unreachable = [p for p in problems if p["check"] == "ssh"]
        code = Exit.NODE_UNREACHABLE if unreachable else Exit.PREFLIGHT_FAILED
        state = "preflight_failed"
        reason = "; ".join(f"{p['host']}: {p['check']}: expected {p['expected']}, found "
                           f"{p['found']}" for p in problems)
    elif not (run_dir / "plan.json").exists():
        code, state, reason = Exit.USAGE, "invalid", _first_message(outcome)
    else:
        code, state, reason = Exit.ERROR, "error", _first_message(outcome)
    return RunResult(run_id=run_id, run_dir=run_dir, state=state, exit_code=code, reason=reason,
                     hosts=(summary or {}).get("hosts", {}),
                     timings=(summary or {}).get("timings", {}), summary=summary or {})


def _prepare(job: dict[str, Any], runs_dir: str | Path | None) -> dict[str, Any]:
    job = validate(dict(job))
    job["run_id"] = job.get("run_id") or new_run_id()
    job["runs_dir"] = str(Path(runs_dir or job["runs_dir"]).resolve())
    job["code_src"] = str(Path(job.get("code_src") or ".").resolve())
    return job


def launch(
    job: dict[str, Any],
    inventory: str | Path,
    *,
    runs_dir: str | Path | None = None,
    on_event: Callable[[Event], None] | None = None,
    cancel: threading.Event | None = None,
    verbosity: int = 0,
) -> RunResult:
    """Run the launch playbook for ``job`` on ``inventory`` and wait for the verdict."""
    ensure_private_umask()
    job = _prepare(job, runs_dir)
    run_dir = Path(job["runs_dir"]) / job["run_id"]
    outcome = run_playbook("launch", inventory, {"torchherd_job": job}, on_event=on_event,
                           cancel=cancel, verbosity=verbosity)
    return result_of(job["run_id"], run_dir, outcome, bool(cancel and cancel.is_set()))


def verify(
    job: dict[str, Any],
    inventory: str | Path,
    *,
    runs_dir: str | Path | None = None,
    on_event: Callable[[Event], None] | None = None,
) -> RunResult:
    """Preflight only: plan and check every node; start nothing."""
    ensure_private_umask()
    job = _prepare(job, runs_dir)
    run_dir = Path(job["runs_dir"]) / job["run_id"]
    outcome = run_playbook("verify", inventory, {"torchherd_job": job}, on_event=on_event)
    result = result_of(job["run_id"], run_dir, outcome, False)
    if result.state == "error" and outcome.rc == 0:
        result.state, result.exit_code, result.reason = "verified", Exit.OK, "every check passed"
    return result
