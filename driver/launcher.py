"""launch and verify: the job checked, the playbook run in a worker thread; a launch restarted
after a failure as the job asks, and settled after a cancel (stopped everywhere, or detached)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from driver import restart as restarts
from driver.handle import OnInterrupt, RunHandle, block
from driver.inputs import inventory_source, prepare_job
from driver.outcomes import (
    cancelled_result,
    forget_unplanned,
    note_verdict,
    remember_inventory,
    result_of,
)
from driver.result import Exit, RunResult, UsageError, cancel_verdict, read_json
from driver.runner import Event, run_playbook


def stop_hint(run_id: str, runs_dir: Path) -> str:
    return f"torchherd stop {run_id} --runs-dir {runs_dir}"


def _settle_after_cancel(handle: RunHandle) -> RunResult:
    """A cancelled launch: stop the job everywhere, or check it runs everywhere (detach)."""
    run_dir = handle.run_dir
    if not (run_dir / "plan.json").exists():
        return RunResult(handle.run_id, run_dir, "launch", "cancelled", Exit.CANCELLED,
                         "cancelled before the plan was made: nothing was started")
    extravars = {"torchherd_run_id": handle.run_id, "torchherd_runs_dir": str(run_dir.parent)}
    hint = stop_hint(handle.run_id, run_dir.parent)
    if handle.on_interrupt == "detach":
        run_playbook("status", handle.inventory, extravars, on_event=handle.emit)
        summary = read_json(run_dir / "summary.json") or {}
        states = {h.get("state") for h in (summary.get("hosts") or {}).values()}
        if states == {"running"}:
            reason = (f"cancelled; the job keeps running on every node (detached); stop it "
                      f"with: {hint}")
            return cancelled_result(run_dir, reason)
        if "running" not in states:
            state, reason = cancel_verdict(summary, False, hint)
            # Started nowhere: the launchers preflight started ahead (the schedule's start.warm)
            # would wait for a start that never comes, until their deadline. The stop of the
            # run id ends them now (on a node where the run never started it ends just that),
            # and a start still in flight with them: nothing was started, as the verdict says.
            warm = (read_json(run_dir / "schedule.json") or {}).get("start", {}).get("warm")
            if warm and states == {"absent"}:
                run_playbook("stop", handle.inventory, extravars, on_event=handle.emit)
            return cancelled_result(run_dir, reason, state)
    # A start in flight when the playbook was killed may still land: stop until none runs.
    for _attempt in range(3):
        run_playbook("stop", handle.inventory, extravars, on_event=handle.emit)
        summary = read_json(run_dir / "summary.json") or {}
        if not any(h.get("state") == "running" for h in (summary.get("hosts") or {}).values()):
            break
    state, reason = cancel_verdict(summary, True, hint)
    return cancelled_result(run_dir, reason, state)


def _launch_work(job: dict[str, Any], verbosity: int, launched_at: float,
                 progress_every: float) -> Callable[[RunHandle], RunResult]:
    def work(handle: RunHandle) -> RunResult:
        remember_inventory(handle.run_dir, handle.inventory)
        # Whole-job restarts (the job's restarts and restart_on): each launch of the run id
        # after a failure leaves the failed nodes out; a spare takes their ranks.
        restart, exclude, incidents = 0, {}, []
        result: RunResult | None = None
        started = launched_at
        try:
            while True:
                outcome = run_playbook("launch", handle.inventory,
                                       {"torchherd_job": job, "torchherd_launched_at": started,
                                        "torchherd_progress_every": progress_every,
                                        "torchherd_restart": restart,
                                        "torchherd_exclude": exclude},
                                       on_event=handle.emit, cancelled=lambda: handle.cancelled,
                                       verbosity=verbosity)
                if outcome.cancelled:
                    return _settle_after_cancel(handle)
                try:
                    latest = result_of(handle.run_dir, "launch", outcome)
                except UsageError as exc:
                    if result is None:
                        raise
                    # The restart could not be planned (too few nodes left, say): the failed
                    # launch stands, and says why it was not restarted.
                    restarts.restore_attempt(handle.run_dir, restart)
                    incidents[-1]["error"] = str(exc)
                    result.reason += f"; restart {restart} could not start: {exc}"
                    break
                result = latest
                restarts.settle(incidents, result.summary)
                nxt = restarts.incident(result.summary,
                                        read_json(handle.run_dir / "schedule.json") or {})
                if nxt is None:
                    break
                incidents.append(nxt)
                restart = nxt["restart"]
                if nxt["node"]:
                    exclude[nxt["node"]] = f"restart {restart}: {nxt['why']}"
                handle.emit({"event": "torchherd_restart", "event_data": dict(nxt)})
                restarts.keep_attempt(handle.run_dir, restart)
                started = time.time()
            if incidents:
                restarts.record(handle.run_dir, incidents)
                result.summary["incidents"] = incidents
                result.incidents = incidents
            if ((handle.run_dir / "plan.json").exists()
                    and not (handle.run_dir / "summary.json").exists()):
                # Ended before any summary (an Ansible error in preflight, say): runs() and
                # prune read its verdict from the driver's note, not "in progress".
                note_verdict(handle.run_dir, "launch", result.state, result.reason)
            # The whole launch as its caller waited for it: summary.json's timings end when
            # the summary was written, before ansible-playbook's own exit.
            result.timings["wall"] = round(time.time() - launched_at, 3)
            return result
        finally:
            forget_unplanned(handle.run_dir)
    return work


def launch_async(
    job: dict[str, Any],
    inventory: str | Path,
    *,
    runs_dir: str | Path | None = None,
    on_interrupt: OnInterrupt = "stop",
    verbosity: int = 0,
    launched_at: float | None = None,
    progress_every: float = 0,
) -> RunHandle:
    """Start the launch playbook (plan, preflight, sync, start, watch, collect) in a thread.

    The job is checked against the job spec first, and the inventory and code_src found
    (JobSpecError, a UsageError, names the key and the expected type); what only the plan can
    find (a node group the inventory lacks, say) makes ``wait()`` raise UsageError. Either way
    no node was touched. ``on_interrupt`` is what ``cancel()`` does to a started job by default.
    With ``job['detach']`` the run ends once the job started on every node (state running).
    ``launched_at`` (seconds since the epoch; default: now) is where the result's timings
    begin: a caller that did work of its own first (the CLI: its process's start) passes it.
    ``progress_every`` (seconds; 0: none) asks for word of the running job that often, for a
    live view fed by ``events()``: the schedule shortens the watch's rounds to it where one
    wait speaks for the job (schedule.json says what it chose).
    """
    launched_at = time.time() if launched_at is None else launched_at
    source = inventory_source(inventory)
    job = prepare_job(job, runs_dir, source, "launch")
    run_dir = Path(job["runs_dir"]) / job["run_id"]
    return RunHandle(job["run_id"], run_dir, source, "launch",
                     _launch_work(job, verbosity, launched_at, progress_every),
                     on_interrupt).start()


def launch(
    job: dict[str, Any],
    inventory: str | Path,
    *,
    runs_dir: str | Path | None = None,
    on_event: Callable[[Event], None] | None = None,
    on_interrupt: OnInterrupt = "stop",
    verbosity: int = 0,
) -> RunResult:
    """Launch ``job`` on the nodes of ``inventory`` and wait for its verdict.

    ``on_event`` is called (in this thread) with every ansible-runner event. On Ctrl-C
    (KeyboardInterrupt) the job is stopped on every node, or left running with
    ``on_interrupt='detach'``, and the KeyboardInterrupt is re-raised.
    """
    handle = launch_async(job, inventory, runs_dir=runs_dir, on_interrupt=on_interrupt,
                          verbosity=verbosity)
    return block(handle, on_event)


def verify_async(job: dict[str, Any], inventory: str | Path, *,
                 runs_dir: str | Path | None = None, verbosity: int = 0) -> RunHandle:
    """Start the verify playbook (plan and preflight only) in a thread. Without a script (no
    job at all, say) it checks the nodes alone: facts, reachability, consistency."""
    source = inventory_source(inventory)
    job = prepare_job(job, runs_dir, source, "verify")
    run_dir = Path(job["runs_dir"]) / job["run_id"]

    def work(handle: RunHandle) -> RunResult:
        try:
            outcome = run_playbook("verify", handle.inventory, {"torchherd_job": job},
                                   on_event=handle.emit, cancelled=lambda: handle.cancelled,
                                   verbosity=verbosity)
            if outcome.cancelled:
                return cancelled_result(run_dir, "cancelled", action="verify")
            result = result_of(run_dir, "verify", outcome)
            if (run_dir / "plan.json").exists():
                note_verdict(run_dir, "verify", result.state, result.reason)
            return result
        finally:
            forget_unplanned(run_dir)

    return RunHandle(job["run_id"], run_dir, source, "verify", work).start()


def verify(job: dict[str, Any], inventory: str | Path, *, runs_dir: str | Path | None = None,
           on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Plan and check every node (preflight); start nothing. OK means the launch would go."""
    return block(verify_async(job, inventory, runs_dir=runs_dir), on_event)
