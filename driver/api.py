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

This module gathers the calls from the modules of their concerns: driver.launcher (launch,
verify), driver.actions (a past run by its id; runs), driver.pruner (prune), driver.ps (ps:
who uses the nodes), driver.connections (disconnect: the SSH connections kept between runs
closed now), driver.handle
(RunHandle), driver.inputs (the checks of what a call takes).
"""

from __future__ import annotations

from driver.actions import LogStream, act_async, collect, logs, runs, stacks, status, stop
from driver.connections import DisconnectReport, disconnect
from driver.handle import OnInterrupt, RunHandle
from driver.inputs import prepare_job as _prepare  # noqa: F401 (integration tests reach it here)
from driver.launcher import launch, launch_async, verify, verify_async
from driver.logs import LogLine
from driver.pruner import prune
from driver.ps import NodeUse, PsReport, ps
from driver.result import Exit, HostResult, RunInfo, RunResult, UsageError
from driver.spec import JobSpecError

__all__ = [
    "DisconnectReport", "Exit", "HostResult", "JobSpecError", "LogLine", "LogStream", "NodeUse",
    "OnInterrupt", "PsReport", "RunHandle", "RunInfo", "RunResult", "UsageError", "act_async",
    "collect", "disconnect", "launch", "launch_async", "logs", "prune", "ps", "runs", "stacks",
    "status", "stop", "verify", "verify_async",
]
