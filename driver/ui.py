"""What the torchherd command shows: on stderr a run's progress (a live table on a terminal,
plain lines otherwise), its verdict and messages; on stdout data only (tables, or one JSON
document)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from driver.handle import RunHandle
from driver.logs import parse_line
from driver.progress import Progress, facts_cells
from driver.prune import PruneReport
from driver.ps import PsReport
from driver.result import Exit, RunInfo, RunResult


def console(stderr: bool = False) -> Console:
    shown = Console(stderr=stderr, highlight=False)
    if not shown.is_terminal:
        # Rich folds tables to 80 columns when no terminal tells it the width; piped output
        # (a file, grep) must keep a run id or a host name on one line.
        shown.width = sys.maxsize
    return shown


# What cancels a run as Ctrl-C does: a `timeout`, systemd or kill (SIGTERM), and a terminal
# that closed (SIGHUP).
CANCELLING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def hang_up() -> None:
    """The terminal is gone: what is written to stdout and stderr from now on goes nowhere,
    instead of failing (EIO) in the middle of settling a run."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


def interrupt_on_signals() -> None:
    """SIGTERM and SIGHUP end an action that does not drive a run (logs, prune) as Ctrl-C does
    (KeyboardInterrupt): its private directory goes and its ansible-playbook with it."""
    def interrupt(signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:
            hang_up()
        raise KeyboardInterrupt

    for sig in CANCELLING[1:]:
        signal.signal(sig, interrupt)


def print_json(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


class Ui:
    """stderr: a live table on a terminal, plain lines otherwise; stdout: data only."""

    def __init__(self, verbose: int = 0) -> None:
        self.err = console(stderr=True)
        self.verbose = verbose

    @property
    def live(self) -> bool:
        """Whether a run's progress is a live table (else plain lines, or Ansible's own)."""
        return self.err.is_terminal and not self.verbose

    def say(self, text: str, style: str = "") -> None:
        self.err.print(f"[{style}]{escape(text)}[/]" if style else escape(text), soft_wrap=True)

    def drive(self, start: Callable[[], RunHandle], *, cancel_note: str) -> RunResult:
        """Start a run and show its progress until it ends. SIGINT, SIGTERM and SIGHUP (also one
        that comes while it starts) cancel it once; later ones only say that it is being
        settled, so that it is never left half-way. After SIGHUP (the terminal closed) nothing
        more is shown: a write to a terminal that is gone would end the settling."""
        handle: RunHandle | None = None
        wanted = False

        def on_signal(signum: int, _frame: Any) -> None:
            nonlocal wanted
            if signum == signal.SIGHUP:
                hang_up()
            if wanted:
                self.say("torchherd: already cancelling; waiting for it to finish", "yellow")
                return
            wanted = True
            self.say(f"torchherd: cancelling ({cancel_note})", "yellow")
            if handle is not None:
                handle.cancel()

        previous = {s: signal.signal(s, on_signal) for s in CANCELLING}
        live = None
        try:
            handle = start()
            if wanted:
                handle.cancel()
            self.say(f"torchherd: {handle.action} {handle.run_id} (on Ctrl-C {cancel_note})")
            progress = Progress(f"torchherd {handle.action} {handle.run_id}")
            if self.live:
                # Refreshed twice a second between events too: the elapsed times move on.
                live = Live(console=self.err, get_renderable=progress.table,
                            refresh_per_second=2, transient=True)
                live.start()
            for event in handle.events():
                lines = progress.update(event)
                if self.verbose:  # Ansible's own words instead (secret values masked)
                    lines = [event["stdout"]] if event.get("stdout") else []
                if live:
                    live.refresh()
                else:
                    for line in lines:
                        self.say(line)
            return handle.wait()
        finally:
            if live:
                live.stop()
            for sig, previous_handler in previous.items():
                signal.signal(sig, previous_handler)

    def report(self, result: RunResult, as_json: bool) -> int:
        if result.hosts:
            self.err.print(_facts_table(result) if result.action == "verify" else _table(result))
        for problem in result.problems:
            self.say(f"  {problem['host']}: {problem['check']}: expected {problem['expected']}, "
                     f"found {problem['found']}; fix: {problem.get('fix', '')}", "red")
        for warning in result.warnings:
            self.say(f"  warning {warning['host']}: {warning['check']}: expected "
                     f"{warning['expected']}, found {warning['found']}; fix: "
                     f"{warning.get('fix', '')}", "yellow")
        for host, why in result.left_out.items():
            self.say(f"  left out {host}: {why}", "yellow")
        if (result.waves or 1) > 1 and result.action == "launch":
            self.say(f"  the launch ran in waves: {result.waves_why}", "yellow")
        for host, seconds in result.idle_gpus.items():
            self.say(f"  idle GPUs on {host}: {seconds:g} s while the other nodes' GPUs worked "
                     f"(a straggler or a stuck rank there?)", "yellow")
        for inc in result.incidents:
            after = inc.get("first_output_after")
            self.say(f"  restart {inc['restart']}"
                     + (" (torchrun's)" if inc.get("by") == "torchrun" else "")
                     + f": {inc['kind']}"
                     + (f" of {inc['node']} (node_rank {inc.get('node_rank')})" if inc["node"]
                        else "")
                     + (f", replaced by {inc['replaced_by']}" if inc.get("replaced_by") else "")
                     + (f"; first output {after:.1f} s after the failure" if after is not None
                        else "") + f" ({inc['why']})", "yellow")
        style = "green" if result.ok else "red"
        if result.action == "launch" and result.sync:
            sync = result.sync
            self.say(f"sync: {sync['files']} files, {sync['bytes']} bytes to "
                     f"{sync['nodes_sent_to']} of {len(result.hosts)} nodes")
        if result.action == "launch" and result.timings.get("first_output") is not None:
            self.say(f"first output {result.timings['first_output']:.1f} s after launch")
        self.say(f"run {result.run_id} {result.state}: {result.reason}", style)
        if result.run_dir.exists():
            self.say(f"run directory: {result.run_dir}")
        if as_json:
            print_json(result.to_dict())
        return int(result.exit_code)

    def report_prune(self, report: PruneReport, as_json: bool) -> int:
        """The runs the policy lets go on stdout (removed, or kept and why); totals on stderr."""
        gone = "would remove" if report.dry_run else "removed"
        if as_json:
            print_json(report.to_dict())
        else:
            console().print(_prune_table(report, gone))
        totals = report.totals()
        where = (f" and {totals['node_dirs']} run directories on nodes "
                 f"({_size(totals['node_bytes'])})" if report.nodes_asked else
                 " (nodes not asked: give -i INVENTORY to prune there too)")
        self.say(f"{gone} {totals['runs']} runs ({_size(totals['bytes'])} on the controller)"
                 f"{where}; kept {totals['kept']} of the {len(report.runs)} runs the policy let go",
                 "green" if report.exit_code == Exit.OK else "red")
        if report.reason:
            self.say(report.reason, "red")
        if report.dry_run and totals["runs"]:
            self.say("dry run: nothing was removed; add --yes to remove them", "yellow")
        return int(report.exit_code)

    def report_ps(self, report: PsReport, as_json: bool) -> int:
        """Who uses the nodes on stdout (the table, or --json's document); what is missing from
        it on stderr: the nodes that did not answer, and those that could not see other users'
        runs."""
        if as_json:
            print_json(report.to_dict())
        else:
            console().print(ps_table(report))
        partial = [h for h, n in report.nodes.items() if n.sees_all is False]
        if partial:
            self.say(f"not root on {', '.join(partial)}: other users' runs there do not show "
                     f"(the kernel hides their environments); -b (become) shows them", "yellow")
        if not report.nodes and report.exit_code == Exit.OK:
            self.say("no nodes: the inventory (within -l) has no hosts", "yellow")
        if report.reason:
            self.say(f"ps: {report.reason}", "red")
        return int(report.exit_code)


def _table(result: RunResult) -> Table:
    table = Table(title=f"run {result.run_id}: {result.state}", title_justify="left")
    # The use column where a node's use was sampled (its cell comes with the summary).
    used = any((h.get("use") or {}).get("cell") for h in result.hosts.values())
    for col in ("node", "rank", "state", "exit", *(("use",) if used else ()),
                "last line / error"):
        table.add_column(col, overflow="fold")
    for host, h in result.hosts.items():
        last = parse_line(host, h.get("node_rank"), result.static_nproc, h.get("last_line") or "")
        note = h.get("exception") or h.get("error") or last.short
        style = {"succeeded": "green", "running": "cyan", "stopped": "yellow",
                 "standby": "yellow"}.get(h.get("state") or "", "red")
        exit_code = h.get("exit_code")
        rank = str(h.get("node_rank")) + (" (standby)" if h.get("standby") else "")
        cells = [escape((h.get("use") or {}).get("cell") or "-")] if used else []
        table.add_row(escape(host), rank, f"[{style}]{h.get('state')}[/]",
                      "-" if exit_code is None else str(exit_code), *cells, escape(note))
    return table


def _facts_table(result: RunResult) -> Table:
    """verify: every node as preflight found it, one row each."""
    table = Table(title=f"run {result.run_id}: the nodes as preflight found them",
                  title_justify="left")
    for col in ("node", "rank", "python", "torch", "cuda", "nccl", "gpus", "launchers",
                "interface", "disk free", "shm", "rdma", "check"):
        table.add_column(col, overflow="fold")
    for host, facts in result.hosts.items():
        table.add_row(*facts_cells(host, facts))
    return table

def runs_table(found: list[RunInfo]) -> Table:
    table = Table(box=None, pad_edge=False)
    for col in ("run id", "state", "started", "nodes", "reason"):
        table.add_column(col, overflow="fold")
    for r in found:
        table.add_row(r.run_id, r.state, _when(r.started_at), ",".join(r.nodes), escape(r.reason))
    return table


def ps_table(report: PsReport) -> Table:
    """One row per run per node, one per GPU process that is no run's, one for a node with
    neither (idle) or no answer."""
    table = Table(box=None, pad_edge=False)
    for col in ("node", "run id / pid", "name", "user", "rank", "gpus", "gpu memory", "since",
                "state"):
        table.add_column(col, overflow="fold")
    for host, node in report.nodes.items():
        if node.no_answer:
            table.add_row(escape(host), "-", "-", "-", "-", "-", "-", "-",
                          f"[red]{escape(node.no_answer)}[/]")
            continue
        for run in node.runs:
            style = {"running": "cyan", "starting": "cyan"}.get(run.get("state") or "", "yellow")
            state = run.get("state") or "-"
            if state == "stale":
                state += f" ({run.get('job_state')})"
            table.add_row(escape(host), escape(run["run_id"]), escape(run.get("name") or "-"),
                          escape(run.get("user") or "-"), _or_dash(run.get("node_rank")),
                          _gpus(run.get("gpus")), _memory(run.get("gpu_memory_bytes")),
                          _when(run.get("started_at")), f"[{style}]{escape(state)}[/]")
        for proc in node.gpu_processes or []:
            table.add_row(escape(host), f"pid {proc['pid']}", escape(proc.get("name") or "-"),
                          escape(proc.get("user") or "-"), "-", _gpus([proc.get("gpu")]),
                          _memory(proc.get("used_memory_bytes")), "-",
                          "[yellow]not torchherd's[/]")
        if not node.runs and not node.gpu_processes:
            table.add_row(escape(host), "-", "-", "-", "-", "-", "-", "-", "[green]idle[/]")
    return table

def _prune_table(report: PruneReport, gone: str) -> Table:
    table = Table(box=None, pad_edge=False)
    for col in ("run id", "state", "started", "controller", "nodes", gone):
        table.add_column(col, overflow="fold")
    for r in report.runs:
        nodes = ", ".join(f"{h} {_size(int(n.get('bytes') or 0))}"
                          + ("" if n.get("removed") else " (kept)")
                          for h, n in r.nodes.items()
                          if n.get("state") not in (None, "missing")) or "-"
        table.add_row(r.run_id, r.state, _when(r.started_at), _size(r.bytes), escape(nodes),
                      "yes" if r.removed else f"no: {escape(r.kept or '')}")
    return table


def _when(started_at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_at)) if started_at else "-"


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return ""


def _or_dash(value: Any) -> str:
    return "-" if value is None else escape(str(value))


def _gpus(gpus: list[Any] | None) -> str:
    return ",".join(str(g) for g in gpus) if gpus else "-"


def _memory(count: int | None) -> str:
    return "-" if count is None else _size(count)
