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

Bad input (a job key, code_src, the inventory, a run id; or what the plan refuses) raises
UsageError (JobSpecError for the job's keys) before any node is touched; a RunResult is what
happened on the nodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import yaml

from driver import restart as restarts
from driver.logs import LogLine, LogTail, parse_line, static_nproc
from driver.prune import (
    PrunedRun,
    PruneReport,
    busy_hold,
    controller_only_hold,
    nodes_hold,
    select,
    size_of,
)
from driver.prune import verdict as prune_verdict
from driver.result import (
    DRIVER_FILE,
    Exit,
    HostResult,
    RunInfo,
    RunResult,
    UsageError,
    cancel_verdict,
    read_json,
    read_result,
    run_info,
    stacks_verdict,
)
from driver.runner import Event, Outcome, run_playbook
from driver.spec import JobSpecError, nproc_problem, validate

__all__ = [
    "Exit", "HostResult", "JobSpecError", "LogLine", "LogStream", "OnInterrupt", "RunHandle",
    "RunInfo", "RunResult", "UsageError", "act_async", "collect", "launch", "launch_async",
    "logs", "prune", "runs", "stacks", "status", "stop", "verify", "verify_async",
]

OnInterrupt = Literal["stop", "detach"]
Action = Literal["status", "stop", "collect", "stacks"]
DEFAULT_RUNS_DIR = "runs"
PRUNE_MODULE = "torchherd.cluster.prune_runs"  # whose answers the prune reads from events
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
    result = read_result(run_dir, action, outcome.rc, _first_message(outcome))
    if result.state == "invalid":
        # The plan refused the input (or Ansible the inventory) before any node was touched:
        # bad input, as the driver's own checks find it, so raised the same way.
        raise UsageError(result.reason)
    return result


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


def _prepare(job: dict[str, Any], runs_dir: str | Path | None, source: str,
             action: str) -> dict[str, Any]:
    """The job to run: the caller's keys over the inventory's job (inventory_job), checked,
    with defaults; the run id, runs_dir and code_src made definite."""
    host, base = inventory_job(source)
    if base:
        where = f"inventory {source}: torchherd_job of host {host}"
        validate(base, where)
        problem = nproc_problem(base.get("nproc_per_node", "auto"))
        if problem:
            raise JobSpecError(f"{where}: {problem}; fix: correct it in the inventory")
    # The caller's env, secret_env and rdzv_conf add to the inventory's, as -e adds to a job
    # file's env.
    job = validate({**base, **job, **{k: {**base[k], **job[k]} for k in job.keys() & base.keys()
                                      if isinstance(base[k], dict) and isinstance(job[k], dict)}})
    if action == "launch" and not job["script"]:
        raise JobSpecError("job key 'script': required (str); give it after -- (the CLI), in "
                           "the job file or in the inventory's torchherd_job")
    job["run_id"] = job.get("run_id") or new_run_id()
    job["runs_dir"] = str(Path(runs_dir or job["runs_dir"] or DEFAULT_RUNS_DIR).resolve())
    given = job.get("code_src") or "."
    job["code_src"] = str(Path(given).expanduser().resolve())
    if not Path(job["code_src"]).is_dir():
        found = "a file" if Path(job["code_src"]).exists() else "no such directory"
        raise JobSpecError(f"job key 'code_src': expected a directory on this machine (the "
                           f"code synced to every node), found {found}: {given} "
                           f"({job['code_src']}); fix: give the directory that holds the "
                           f"script, relative to where torchherd runs or absolute")
    if (Path(job["runs_dir"]) / job["run_id"] / "plan.json").exists():
        raise JobSpecError(f"job key 'run_id': expected a new run id, found run "
                           f"{job['run_id']} already in {job['runs_dir']}; use status, stop "
                           f"or collect on it, or launch with another run id (or none)")
    return job


def _plugin_config(source: str) -> bool:
    """Whether the inventory source is a YAML file naming an inventory plugin."""
    path = Path(source)
    if not path.is_file() or path.suffix not in (".yml", ".yaml"):
        return False
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and "plugin" in data


def _may_hold_a_job(source: str) -> bool:
    """Whether Ansible could find a torchherd_job in this inventory source, told without
    Ansible's inventory: what reading it costs (its managers' imports, ~0.25 s) is on every
    launch's way to its first step. False only where none can be there: no file Ansible would
    read for the source's variables (the source itself, its group_vars and host_vars, every
    file of a source directory) names the key, none is vaulted, none is an inventory script,
    and Ansible's configuration enables no vars plugin beyond host_group_vars, nor puts any in
    a vars plugin path. Anything else (an unreadable file, a directory linked in) reads the
    inventory."""
    from ansible import constants

    enabled = set(constants.VARIABLE_PLUGINS_ENABLED or ()) - {"", "host_group_vars",
                                                               "ansible.builtin.host_group_vars"}
    legacy = [Path(d) for d in constants.DEFAULT_VARS_PLUGIN_PATH or () if Path(d).is_dir()]
    if enabled or any(any(d.iterdir()) for d in legacy):
        return True
    path = Path(source)
    if not path.exists():
        # An inline host list (node1,node2,) has no variables' files; anything else is for
        # Ansible to read (and to report).
        return "," not in source
    sources = [path] if path.is_file() else []
    roots = [path] if path.is_dir() else [path.parent / "group_vars", path.parent / "host_vars"]
    varfiles: list[Path] = []
    for root in roots:
        for top, dirs, files in os.walk(root):
            if any(Path(top, d).is_symlink() for d in dirs):
                return True
            varfiles += [Path(top, f) for f in files]
    if path.is_dir():
        sources = [f for f in varfiles
                   if not {"group_vars", "host_vars"} & set(f.relative_to(path).parts)]
    for file in {*sources, *varfiles}:
        if file in sources and os.access(file, os.X_OK):
            return True
        try:
            data = file.read_bytes()
        except OSError:
            return True
        if b"torchherd_job" in data or b"$ANSIBLE_VAULT" in data:
            return True
    return False


def inventory_job(source: str) -> tuple[str, dict[str, Any]]:
    """The job the inventory defines, and the host it was read from: as the plan role's
    default takes it (roles/plan/defaults/main.yml), the torchherd_job of the first inventory
    host that has one, templated. ("", {}) where none has one.

    The driver passes its job as extra vars, which hide the inventory's job from the plan:
    so it reads that job here, with Ansible's own inventory and variable managers, and puts the
    caller's keys over it."""
    if _plugin_config(source):
        # An inventory plugin's configuration (torchherd.cluster.slurm, say): the plugin is a
        # collection's, which this process does not load; ansible-playbook reads it, and the job
        # is the role's default there.
        return "", {}
    if not _may_hold_a_job(source):
        return "", {}
    from ansible import constants
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    name = ""
    try:
        # The caller's vault passwords, as ansible-playbook takes them from their
        # configuration (vault_identity_list; vault_password_file, which this adds itself): a
        # vaulted group_vars file must not stop the read.
        if constants.DEFAULT_VAULT_PASSWORD_FILE or constants.DEFAULT_VAULT_IDENTITY_LIST:
            from ansible.cli import CLI  # a tenth of a second: only where there is a vault

            loader.set_vault_secrets(CLI.setup_vault_secrets(
                loader, constants.DEFAULT_VAULT_IDENTITY_LIST, vault_password_files=[],
                ask_vault_pass=False, auto_prompt=False, initialize_context=False))
        try:
            inventory = InventoryManager(loader=loader, sources=[source])
        except AnsibleError:
            # A source only ansible-playbook's configuration reads (a collection's inventory
            # plugin, such as torchherd.cluster.slurm, which this process does not load):
            # ansible-playbook reports what is wrong with it, and its job is the role's default.
            return "", {}
        variables = VariableManager(loader=loader, inventory=inventory)
        # localhost first: the plan runs there, and a job its variables give (host_vars/
        # localhost, group_vars/all) is the role's value before its default looks at the nodes.
        for name in ["localhost", *inventory.get_groups_dict().get("all", [])]:
            hostvars = variables.get_vars(host=inventory.get_host(name), include_hostvars=False)
            if "torchherd_job" in hostvars:
                job = Templar(loader, variables=hostvars).template(hostvars["torchherd_job"])
                break
        else:
            return "", {}
    except AnsibleError as exc:
        raise JobSpecError(f"inventory {source}: torchherd_job{f' of host {name}' if name else ''}"
                           f": expected variables the driver can read, found {exc.message}; "
                           f"fix: correct the inventory (ansible-inventory -i {source} --list "
                           f"shows what Ansible reads), or, where a file is vaulted, give Ansible "
                           f"its password (vault_password_file in ansible.cfg)") from exc
    if not isinstance(job, dict):
        raise JobSpecError(f"inventory {source}: torchherd_job of host {name}: expected a "
                           f"mapping, found {type(job).__name__}; fix: correct it")
    # Plain data, as a job file gives it (Ansible's values carry its data tags).
    return name, json.loads(json.dumps(job))


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
    hint = stop_hint(handle.run_id, run_dir.parent)
    if handle.on_interrupt == "detach":
        run_playbook("status", handle.inventory, extravars, on_event=handle.emit)
        summary = read_json(run_dir / "summary.json") or {}
        states = {h.get("state") for h in (summary.get("hosts") or {}).values()}
        if states == {"running"}:
            reason = (f"cancelled; the job keeps running on every node (detached); stop it "
                      f"with: {hint}")
            return _cancelled(run_dir, reason)
        if "running" not in states:
            state, reason = cancel_verdict(summary, False, hint)
            # Started nowhere: the launchers preflight started ahead (the schedule's start.warm)
            # would wait for a start that never comes, until their deadline. The stop of the
            # run id ends them now (on a node where the run never started it ends just that),
            # and a start still in flight with them: nothing was started, as the verdict says.
            warm = (read_json(run_dir / "schedule.json") or {}).get("start", {}).get("warm")
            if warm and states == {"absent"}:
                run_playbook("stop", handle.inventory, extravars, on_event=handle.emit)
            return _cancelled(run_dir, reason, state)
    # A start in flight when the playbook was killed may still land: stop until none runs.
    for _attempt in range(3):
        run_playbook("stop", handle.inventory, extravars, on_event=handle.emit)
        summary = read_json(run_dir / "summary.json") or {}
        if not any(h.get("state") == "running" for h in (summary.get("hosts") or {}).values()):
            break
    state, reason = cancel_verdict(summary, True, hint)
    return _cancelled(run_dir, reason, state)


def _cancelled(run_dir: Path, reason: str, state: str | None = None,
               action: str = "launch") -> RunResult:
    """The result of a cancelled action; for a launch, with ``state`` (where the summary
    cannot tell it, e.g. nothing had started) noted in the run directory for runs()."""
    result = read_result(run_dir, action, 0, reason)
    result.exit_code, result.reason = Exit.CANCELLED, reason
    if state is not None:
        result.state = state
        _note_verdict(run_dir, "cancelled", state, reason)
    return result


def _note_verdict(run_dir: Path, key: str, state: str, reason: str) -> None:
    """The verdict of a run no summary.json tells (runs() reads it): in the driver's note."""
    note = read_json(run_dir / DRIVER_FILE) or {}
    note[key] = {"state": state, "reason": reason}
    (run_dir / DRIVER_FILE).write_text(json.dumps(note) + "\n", encoding="utf-8")


def _launch_work(job: dict[str, Any], verbosity: int, launched_at: float,
                 progress_every: float) -> Callable[[RunHandle], RunResult]:
    def work(handle: RunHandle) -> RunResult:
        _remember_inventory(handle.run_dir, handle.inventory)
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
                    latest = _result(handle.run_dir, "launch", outcome)
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
                _note_verdict(handle.run_dir, "launch", result.state, result.reason)
            # The whole launch as its caller waited for it: summary.json's timings end when
            # the summary was written, before ansible-playbook's own exit.
            result.timings["wall"] = round(time.time() - launched_at, 3)
            return result
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
    job = _prepare(job, runs_dir, source, "launch")
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
    return _block(handle, on_event)


def verify_async(job: dict[str, Any], inventory: str | Path, *,
                 runs_dir: str | Path | None = None, verbosity: int = 0) -> RunHandle:
    """Start the verify playbook (plan and preflight only) in a thread. Without a script (no
    job at all, say) it checks the nodes alone: facts, reachability, consistency."""
    source = inventory_source(inventory)
    job = _prepare(job, runs_dir, source, "verify")
    run_dir = Path(job["runs_dir"]) / job["run_id"]

    def work(handle: RunHandle) -> RunResult:
        try:
            outcome = run_playbook("verify", handle.inventory, {"torchherd_job": job},
                                   on_event=handle.emit, cancelled=lambda: handle.cancelled,
                                   verbosity=verbosity)
            if outcome.cancelled:
                return _cancelled(run_dir, "cancelled", action="verify")
            result = _result(run_dir, "verify", outcome)
            if (run_dir / "plan.json").exists():
                _note_verdict(run_dir, "verify", result.state, result.reason)
            return result
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
            return _cancelled(run_dir, f"{action} cancelled", action=action)
        result = _result(run_dir, action, outcome)
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



# --------------------------------------------------------------------------------------------
# prune: old runs' directories, on the controller and on their nodes


def _ask_nodes(targets: dict[str, list[dict[str, str]]], inventory: str, remove: bool,
               on_event: Callable[[Event], None] | None, verbosity: int,
               ) -> tuple[dict[str, dict[str, dict[str, Any]]], Outcome]:
    """The prune playbook on the nodes: run id -> host -> prune_runs' answer for the run (or
    ``no_answer``: why the node said nothing)."""
    answers: dict[str, dict[str, dict[str, Any]]] = {}

    def seen(event: Event) -> None:
        data = event.get("event_data") or {}
        if (data.get("resolved_action") or data.get("task_action")) == PRUNE_MODULE:
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
    return answers, outcome


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
            asked, outcome = _ask_nodes(targets, source, remove_now, on_event, verbosity)
            if not asked and outcome.rc != 0:
                report.exit_code, report.reason = Exit.ERROR, _first_message(outcome)
                for entry in report.runs:
                    entry.kept = f"the nodes could not be asked: {report.reason}"
                return report
            answers.update(asked)
            for run in chosen:
                if holds[run.run_id] is None:
                    holds[run.run_id] = nodes_hold(hosts[run.run_id], asked.get(run.run_id, {}))
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
