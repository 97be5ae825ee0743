"""Programmatic launch and result collection, for scripts and notebooks.

    >>> from driver import launch, logs, runs
    >>> run = launch({"script": "allreduce.py", "code_src": "examples", "nproc_per_node": 2},
    ...              "inventories/local.ini")
    >>> run.ok, run.hosts["node0"]["state"], run.hosts["node0"]["log"]

    >>> handle = launch_async({..., "args": ["--sleep", "60"]}, "inventories/local.ini")
    >>> for event in handle.events(): ...      # ansible-runner events until the run ends
    >>> handle.cancel()                        # stops the job on every node (or on_interrupt)
    >>> handle.wait().exit_code                # Exit.CANCELLED

Every call runs one of the collection's playbooks through ansible-runner in a worker thread,
so Ctrl-C in the calling thread (KeyboardInterrupt) cancels the playbook cleanly, settles the
job's fate (``on_interrupt``: stop it, or leave it running detached) and then re-raises.

Runs live in ``<runs_dir>/<run_id>/`` (runs_dir defaults to ``runs`` in the current
directory). A launch records its inventory there (driver.json), so status, stop, collect and
logs need only the run id.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from driver.logs import LogLine, LogTail, parse_line, static_nproc
from driver.result import (
    Exit,
    HostResult,
    RunInfo,
    RunResult,
    UsageError,
    read_json,
    read_result,
    run_info,
)
from driver.runner import Event, Outcome, run_playbook
from driver.spec import JobSpecError, validate

__all__ = [
    "Exit", "HostResult", "JobSpecError", "LogLine", "LogStream", "OnInterrupt", "RunHandle",
    "RunInfo", "RunResult", "UsageError", "act_async", "collect", "launch", "launch_async",
    "logs", "runs", "stacks", "status", "stop", "verify", "verify_async",
]

OnInterrupt = Literal["stop", "detach"]
Action = Literal["status", "stop", "collect", "stacks"]
DRIVER_FILE = "driver.json"  # the driver's own note in a run directory: the inventory
DEFAULT_RUNS_DIR = "runs"
_END = object()


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


# ansible-core's account of where a plugin failed ("Task failed: Finalization of task args for
# 'ansible.builtin.set_fact' failed: Error while resolving value for 'torchherd_plan': The
# filter plugin 'torchherd.cluster.plan' failed: ..."), in front of the plugin's own message.
_ANSIBLE_WRAPPER = re.compile(r"^(?:Task failed: |Finalization of task args for '[^']*' failed: "
                              r"|Error while resolving value for '[^']*': "
                              r"|The \w+ plugin '[^']*' failed: )+")


def _first_message(outcome: Outcome) -> str:
    for event in outcome.failures:
        data = event.get("event_data", {})
        res = data.get("res", {})
        msg = _ANSIBLE_WRAPPER.sub("", str(res.get("msg") or res.get("stderr") or ""))
        if msg:
            host = data.get("host", "")
            if "Host key verification failed" in msg:
                msg += _HOST_KEY_FIX.format(host=host, address=data.get("remote_addr") or host)
            return f"{host}: {msg}" if host and host != "localhost" else str(msg)
    if outcome.errors:
        return outcome.errors[0]
    return f"ansible-runner ended {outcome.status} (rc {outcome.rc})"


# Host key checking stays on; the driver runs SSH in batch mode, so an unknown key is an error.
_HOST_KEY_FIX = (" (ssh host key check: expected the host key of {host} ({address}) in "
                 "known_hosts, found it unknown or changed; fix: check the key's fingerprint with "
                 "the node's owner and add it, e.g. ssh-keyscan {address} >> ~/.ssh/known_hosts "
                 "after comparing, or turn checking off yourself with host_key_checking = False "
                 "in your ansible.cfg)")



def _result(run_dir: Path, action: str, outcome: Outcome) -> RunResult:
    return read_result(run_dir, action, outcome.rc, _first_message(outcome))


class RunHandle:
    """A playbook running in a background thread: its events, its end, its cancellation.

    ``events()`` yields ansible-runner events (dicts, as ansible-runner emits them, secret_env
    values masked) until the run ends, including those of the stop or status playbook that a
    cancel runs; ``wait()``
    returns the RunResult; ``cancel()`` stops the playbook and settles the job's fate. One
    consumer of ``events()`` at a time.
    """

    def __init__(self, run_id: str, run_dir: Path, inventory: str, action: str,
                 work: Callable[[RunHandle], RunResult],
                 on_interrupt: OnInterrupt = "stop") -> None:
        self.run_id = run_id
        self.run_dir = run_dir
        self.inventory = inventory
        self.action = action
        self.on_interrupt: OnInterrupt = on_interrupt
        self._work = work
        self._queue: queue.Queue[Any] = queue.Queue()
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=f"torchherd-{run_id}",
                                        daemon=True)

    def start(self) -> RunHandle:
        self._thread.start()
        return self

    def _main(self) -> None:
        try:
            self._result = self._work(self)
        except BaseException as exc:  # handed to the caller by wait()
            self._error = exc
        finally:
            self._done.set()
            self._queue.put(_END)

    def emit(self, event: Event) -> None:
        self._queue.put(event)

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self, on_interrupt: OnInterrupt | None = None) -> None:
        """Stop the playbook; for a launch, then stop the job on every node, or, with
        on_interrupt 'detach', leave it running (a job that had not started on every node is
        stopped all the same: never half-way). Returns at once; wait() for the result."""
        if on_interrupt is not None:
            self.on_interrupt = on_interrupt
        self._cancel.set()

    def done(self) -> bool:
        return self._done.is_set()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Events until the run ends; queue.Empty if none comes within ``timeout`` seconds."""
        while True:
            item = self._queue.get(timeout=timeout)
            if item is _END:
                self._queue.put(_END)  # for a later call, or another consumer
                return
            yield item

    def wait(self, timeout: float | None = None) -> RunResult:
        """The result, once the run (and any cleanup after a cancel) ended."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"run {self.run_id} still going after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def _block(handle: RunHandle, on_event: Callable[[Event], None] | None) -> RunResult:
    """Wait for a handle in the calling thread; Ctrl-C there cancels it, then re-raises."""
    try:
        for event in handle.events():
            if on_event:
                on_event(event)
    except KeyboardInterrupt:
        handle.cancel()
        handle.wait()
        raise
    return handle.wait()


# --------------------------------------------------------------------------------------------
# launch and verify


def _prepare(job: dict[str, Any], runs_dir: str | Path | None) -> dict[str, Any]:
    job = validate(dict(job))
    job["run_id"] = job.get("run_id") or new_run_id()
    job["runs_dir"] = str(Path(runs_dir or job["runs_dir"] or DEFAULT_RUNS_DIR).resolve())
    job["code_src"] = str(Path(job.get("code_src") or ".").expanduser().resolve())
    if (Path(job["runs_dir"]) / job["run_id"] / "plan.json").exists():
        raise JobSpecError(f"job key 'run_id': expected a new run id, found run "
                           f"{job['run_id']} already in {job['runs_dir']}; use status, stop "
                           f"or collect on it, or launch with another run id (or none)")
    return job


def inventory_source(value: str | Path) -> str:
    """What ansible-playbook's -i takes, checked before anything runs: an inventory file or
    directory (absolute, so that status, stop and collect find it from anywhere), or an inline
    host list (``node1,node2,``) as Ansible reads it."""
    text = str(value)
    path = Path(text).expanduser()
    if path.exists():
        return str(path.resolve())
    if "," in text:
        return text
    raise UsageError(f"inventory {text}: expected an inventory file or directory, or an inline "
                     f"host list (node1,node2,), found no such file; fix: give the path of "
                     f"your inventory (e.g. inventories/cluster.ini)")


def _remember_inventory(run_dir: Path, inventory: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / DRIVER_FILE).write_text(json.dumps({"inventory": str(inventory)}) + "\n",
                                       encoding="utf-8")


def _forget_unplanned(run_dir: Path) -> None:
    """A launch that never got its plan leaves no run behind."""
    if not (run_dir / "plan.json").exists():
        (run_dir / DRIVER_FILE).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # not empty: something else lives there
            run_dir.rmdir()


def stop_hint(run_id: str, runs_dir: Path) -> str:
    return f"torchherd stop {run_id} --runs-dir {runs_dir}"


def _settle_after_cancel(handle: RunHandle) -> RunResult:
    """A cancelled launch: stop the job everywhere, or check it runs everywhere (detach)."""
    run_dir = handle.run_dir
    if not (run_dir / "plan.json").exists():
        return RunResult(handle.run_id, run_dir, "launch", "cancelled", Exit.CANCELLED,
                         "cancelled before the plan was made: nothing was started")
    extravars = {"torchherd_run_id": handle.run_id, "torchherd_runs_dir": str(run_dir.parent)}
    prefix = "cancelled;"
    if handle.on_interrupt == "detach":
        run_playbook("status", handle.inventory, extravars, on_event=handle.emit)
        summary = read_json(run_dir / "summary.json") or {}
        states = {h.get("state") for h in (summary.get("hosts") or {}).values()}
        if states == {"running"}:
            reason = (f"cancelled; the job keeps running on every node (detached); stop it "
                      f"with: {stop_hint(handle.run_id, run_dir.parent)}")
            return _cancelled(run_dir, reason)
        if "running" not in states:
            reason = ("cancelled before the job started: nothing is running"
                      if states <= {"absent"} else
                      f"cancelled; the job had already ended: {summary.get('state')}")
            return _cancelled(run_dir, reason)
        prefix = "cancelled while the job was not running on every node;"
    # A start in flight when the playbook was killed may still land: stop until none runs.
    for _attempt in range(3):
        run_playbook("stop", handle.inventory, extravars, on_event=handle.emit)
        summary = read_json(run_dir / "summary.json") or {}
        if not any(h.get("state") == "running" for h in (summary.get("hosts") or {}).values()):
            break
    return _cancelled(run_dir, f"{prefix} the job was stopped on every node")


def _cancelled(run_dir: Path, reason: str, action: str = "launch") -> RunResult:
    result = read_result(run_dir, action, 0, reason)
    result.exit_code, result.reason = Exit.CANCELLED, reason
    return result


def _launch_work(job: dict[str, Any], verbosity: int) -> Callable[[RunHandle], RunResult]:
    def work(handle: RunHandle) -> RunResult:
        _remember_inventory(handle.run_dir, handle.inventory)
        try:
            outcome = run_playbook("launch", handle.inventory, {"torchherd_job": job},
                                   on_event=handle.emit, cancelled=lambda: handle.cancelled,
                                   verbosity=verbosity)
            if outcome.cancelled:
                return _settle_after_cancel(handle)
            return _result(handle.run_dir, "launch", outcome)
        finally:
            _forget_unplanned(handle.run_dir)
    return work


def launch_async(
    job: dict[str, Any],
    inventory: str | Path,
    *,
    runs_dir: str | Path | None = None,
    on_interrupt: OnInterrupt = "stop",
    verbosity: int = 0,
) -> RunHandle:
    """Start the launch playbook (plan, preflight, sync, start, watch, collect) in a thread.

    The job is checked against the job spec first (JobSpecError names the key and the
    expected type). ``on_interrupt`` is what ``cancel()`` does to a started job by default.
    With ``job['detach']`` the run ends once the job started on every node (state running).
    """
    source = inventory_source(inventory)
    job = _prepare(job, runs_dir)
    run_dir = Path(job["runs_dir"]) / job["run_id"]
    return RunHandle(job["run_id"], run_dir, source, "launch",
                     _launch_work(job, verbosity), on_interrupt).start()


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
    return _block(handle, on_event)


def verify_async(job: dict[str, Any], inventory: str | Path, *,
                 runs_dir: str | Path | None = None, verbosity: int = 0) -> RunHandle:
    """Start the verify playbook (plan and preflight only) in a thread."""
    source = inventory_source(inventory)
    job = _prepare(job, runs_dir)
    run_dir = Path(job["runs_dir"]) / job["run_id"]

    def work(handle: RunHandle) -> RunResult:
        try:
            outcome = run_playbook("verify", handle.inventory, {"torchherd_job": job},
                                   on_event=handle.emit, cancelled=lambda: handle.cancelled,
                                   verbosity=verbosity)
            if outcome.cancelled:
                return _cancelled(run_dir, "cancelled", "verify")
            return _result(run_dir, "verify", outcome)
        finally:
            _forget_unplanned(run_dir)

    return RunHandle(job["run_id"], run_dir, source, "verify", work).start()


def verify(job: dict[str, Any], inventory: str | Path, *, runs_dir: str | Path | None = None,
           on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Plan and check every node (preflight); start nothing. OK means the launch would go."""
    return _block(verify_async(job, inventory, runs_dir=runs_dir), on_event)


# --------------------------------------------------------------------------------------------
# Acting on a run id: status, stop, collect, logs, runs


def _runs_dir(runs_dir: str | Path | None) -> Path:
    return Path(runs_dir or DEFAULT_RUNS_DIR).resolve()


def _existing_run(run_id: str, runs_dir: str | Path | None,
                  inventory: str | Path | None) -> tuple[Path, str]:
    """The run's directory and inventory (given, or the one its launch recorded)."""
    run_dir = _runs_dir(runs_dir) / run_id
    if not (run_dir / "plan.json").is_file():
        raise UsageError(f"run {run_id}: expected {run_dir}/plan.json, found no such run; "
                         f"see `torchherd runs --runs-dir {run_dir.parent}`")
    if inventory is None:
        inventory = (read_json(run_dir / DRIVER_FILE) or {}).get("inventory")
        if not inventory:
            raise UsageError(f"run {run_id}: expected an inventory, found none given and none "
                             f"recorded by its launch; pass -i INVENTORY")
    return run_dir, inventory_source(inventory)


def act_async(action: Action, run_id: str, *, runs_dir: str | Path | None = None,
              inventory: str | Path | None = None, verbosity: int = 0) -> RunHandle:
    """Start status, stop, collect or stacks on run ``run_id`` in a thread."""
    if action not in ("status", "stop", "collect", "stacks"):
        raise UsageError(f"action: expected status, stop, collect or stacks, found {action!r}")
    run_dir, inv = _existing_run(run_id, runs_dir, inventory)
    extravars = {"torchherd_run_id": run_id, "torchherd_runs_dir": str(run_dir.parent)}

    def work(handle: RunHandle) -> RunResult:
        outcome = run_playbook(action, inv, extravars, on_event=handle.emit,
                               cancelled=lambda: handle.cancelled, verbosity=verbosity)
        if outcome.cancelled:
            return _cancelled(run_dir, f"{action} cancelled", action)
        return _result(run_dir, action, outcome)

    return RunHandle(run_id, run_dir, inv, action, work).start()


def status(run_id: str, *, runs_dir: str | Path | None = None,
           inventory: str | Path | None = None,
           on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Ask every node of the run for the job's state; changes nothing but summary.json."""
    return _block(act_async("status", run_id, runs_dir=runs_dir, inventory=inventory), on_event)


def stop(run_id: str, *, runs_dir: str | Path | None = None,
         inventory: str | Path | None = None,
         on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Stop the job on every node (SIGTERM, SIGKILL after the grace period), then collect."""
    return _block(act_async("stop", run_id, runs_dir=runs_dir, inventory=inventory), on_event)


def stacks(run_id: str, *, runs_dir: str | Path | None = None,
           inventory: str | Path | None = None,
           on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Read every rank's Python stack on every node (py-spy; on NCCL the Flight Recorder too)
    into the run's stacks/ directory; the job goes on running. ``RunResult.stacks`` holds the
    report: where the ranks are, the odd ones out first."""
    return _block(act_async("stacks", run_id, runs_dir=runs_dir, inventory=inventory), on_event)


def collect(run_id: str, *, runs_dir: str | Path | None = None,
            inventory: str | Path | None = None,
            on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Fetch every node's logs and artifacts (whatever the job's state); rewrite summary.json."""
    return _block(act_async("collect", run_id, runs_dir=runs_dir, inventory=inventory),
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
        run_dir, inv = _existing_run(run_id, runs_dir, inventory)
    else:
        run_dir, inv = _runs_dir(runs_dir) / run_id, None
        if not (run_dir / "plan.json").is_file():
            raise UsageError(f"run {run_id}: expected {run_dir}/plan.json, found no such run")
    return LogStream(run_id, run_dir, inv, follow, interval, fetch)


def runs(runs_dir: str | Path | None = None) -> list[RunInfo]:
    """Past runs in ``runs_dir``, oldest first: run id, state, start time, nodes, reason."""
    base = _runs_dir(runs_dir)
    found = [info for d in (base.iterdir() if base.is_dir() else []) if d.is_dir()
             for info in [run_info(d)] if info is not None]
    return sorted(found, key=lambda r: (r.started_at or 0.0, r.run_id))

