"""Acting on a past run by its id (status, stop, collect, stacks, logs), and listing the runs
of a runs directory."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from driver.handle import RunHandle, block
from driver.inputs import existing_run, runs_path
from driver.logs import LogLine, LogTail, parse_line, static_nproc
from driver.outcomes import cancelled_result, result_of
from driver.result import RunInfo, RunResult, UsageError, read_json, run_info, stacks_verdict
from driver.runner import Event, run_playbook

Action = Literal["status", "stop", "collect", "stacks"]


def act_async(action: Action, run_id: str, *, runs_dir: str | Path | None = None,
              inventory: str | Path | None = None, verbosity: int = 0) -> RunHandle:
    """Start status, stop, collect or stacks on run ``run_id`` in a thread."""
    if action not in ("status", "stop", "collect", "stacks"):
        raise UsageError(f"action: expected status, stop, collect or stacks, found {action!r}")
    run_dir, inv = existing_run(run_id, runs_dir, inventory)
    extravars = {"torchherd_run_id": run_id, "torchherd_runs_dir": str(run_dir.parent)}

    def work(handle: RunHandle) -> RunResult:
        outcome = run_playbook(action, inv, extravars, on_event=handle.emit,
                               cancelled=lambda: handle.cancelled, verbosity=verbosity)
        if outcome.cancelled:
            return cancelled_result(run_dir, f"{action} cancelled", action=action)
        result = result_of(run_dir, action, outcome)
        # The job's state says nothing of the stacks asked for: a node without py-spy, or
        # with no rank, fails the action, not the job.
        failed = stacks_verdict(result.stacks) if action == "stacks" and result.ok else None
        if failed:
            result.exit_code, result.reason = failed
        return result

    return RunHandle(run_id, run_dir, inv, action, work).start()


def status(run_id: str, *, runs_dir: str | Path | None = None,
           inventory: str | Path | None = None,
           on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Ask every node of the run for the job's state; changes nothing but summary.json."""
    return block(act_async("status", run_id, runs_dir=runs_dir, inventory=inventory), on_event)


def stop(run_id: str, *, runs_dir: str | Path | None = None,
         inventory: str | Path | None = None,
         on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Stop the job on every node (SIGTERM, SIGKILL after the grace period), then collect."""
    return block(act_async("stop", run_id, runs_dir=runs_dir, inventory=inventory), on_event)


def stacks(run_id: str, *, runs_dir: str | Path | None = None,
           inventory: str | Path | None = None,
           on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Read every rank's Python stack on every node (py-spy; on NCCL the Flight Recorder too)
    into the run's stacks/ directory; the job goes on running. ``RunResult.stacks`` holds the
    report: where the ranks are, the odd ones out first."""
    return block(act_async("stacks", run_id, runs_dir=runs_dir, inventory=inventory), on_event)


def collect(run_id: str, *, runs_dir: str | Path | None = None,
            inventory: str | Path | None = None,
            on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Fetch every node's logs and artifacts (whatever the job's state); rewrite summary.json."""
    return block(act_async("collect", run_id, runs_dir=runs_dir, inventory=inventory),
                  on_event)


class LogStream:
    """The lines of every node's log, as ``logs()`` returns them; iterate it once.

    ``result`` is the RunResult of the latest fetch (None with ``fetch=False``).
    """

    def __init__(self, run_id: str, run_dir: Path, inventory: str | None, follow: bool,
                 interval: float, fetch: bool) -> None:
        self.run_id, self.run_dir, self.inventory = run_id, run_dir, inventory
        self.follow, self.interval, self.fetch = follow, interval, fetch
        self.result: RunResult | None = None

    def _refresh(self) -> bool:
        """Fetch the logs once; True while the job still runs."""
        if not self.fetch:
            return False
        self.result = collect(self.run_id, runs_dir=self.run_dir.parent,
                              inventory=self.inventory)
        return self.follow and self.result.state == "running"

    def __iter__(self) -> Iterator[LogLine]:
        plan = read_json(self.run_dir / "plan.json") or {}
        tails = {n["host"]: LogTail(self.run_dir / "nodes" / n["host"] / "node.log")
                 for n in plan.get("nodes") or []}
        ranks = {n["host"]: n.get("node_rank") for n in plan.get("nodes") or []}
        running = True
        while running:
            started = time.monotonic()
            running = self._refresh()
            nproc = static_nproc(plan, read_json(self.run_dir / "preflight.json"))
            for host, tail in tails.items():
                for raw in tail.read(final=not running):
                    yield parse_line(host, ranks[host], nproc, raw)
            if running:
                time.sleep(max(0.0, self.interval - (time.monotonic() - started)))


def logs(run_id: str, *, runs_dir: str | Path | None = None,
         inventory: str | Path | None = None, follow: bool = False, interval: float = 3.0,
         fetch: bool = True) -> LogStream:
    """Every node's log, each line as a LogLine (``str()`` gives ``<host> r<rank>: text``).

    ``fetch`` brings the logs back first (the collect playbook); ``follow`` repeats that every
    ``interval`` seconds and yields the new lines until the job no longer runs.
    """
    if fetch:
        run_dir, inv = existing_run(run_id, runs_dir, inventory)
    else:
        run_dir, inv = runs_path(runs_dir) / run_id, None
        if not (run_dir / "plan.json").is_file():
            raise UsageError(f"run {run_id}: expected {run_dir}/plan.json, found no such run")
    return LogStream(run_id, run_dir, inv, follow, interval, fetch)


def runs(runs_dir: str | Path | None = None) -> list[RunInfo]:
    """Past runs in ``runs_dir``, oldest first: run id, state, start time, nodes, reason."""
    base = runs_path(runs_dir)
    found = [info for d in (base.iterdir() if base.is_dir() else []) if d.is_dir()
             for info in [run_info(d)] if info is not None]
    return sorted(found, key=lambda r: (r.started_at or 0.0, r.run_id))
