"""torchherd: launch and inspect multi-node torchrun jobs (python -m driver, or torchherd).

Data goes to stdout (--json: one JSON document), messages and progress to stderr: a live
per-node table on a terminal, plain lines otherwise. Exit codes: 0 ok, 2 usage error,
3 preflight failed, 4 job failed, 5 node unreachable, 6 timeout, 130 cancelled.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from driver import api
from driver.logs import parse_line
from driver.progress import Progress
from driver.result import Exit, RunResult, UsageError
from driver.spec import JobSpecError, job_options, read_job_file, validate

# Job keys with flags of their own shape (script and args come after --; --runs-dir is
# common to every action).
_SPECIAL_KEYS = {"script", "args", "secret_env", "detach", "runs_dir"}
_MARKUP = re.compile(r"[CIOV]\(([^)]*)\)")


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _job_args(parser: argparse.ArgumentParser, launch: bool) -> None:
    """Flags for the job keys, generated from the job spec (the one definition)."""
    parser.add_argument("-i", "--inventory", required=True, help="Ansible inventory of the nodes")
    parser.add_argument("-j", "--job", metavar="FILE",
                        help="job spec YAML (torchherd_job: or its keys); flags override it")
    for key, opt in job_options().items():
        if key in _SPECIAL_KEYS:
            continue
        text = _MARKUP.sub(r"\1", opt.get("description", ""))
        if opt.get("type") == "list":
            parser.add_argument(_flag(key), dest=f"job_{key}", action="append", metavar="VALUE",
                                help=f"{text} (repeat for several)")
        elif opt.get("type") == "dict":
            names = ["-e", _flag(key)] if key == "env" else [_flag(key)]
            parser.add_argument(*names, dest=f"pairs_{key}", action="append", default=[],
                                metavar="KEY=VALUE", help=f"{text} (repeat for several)")
        else:
            parser.add_argument(_flag(key), dest=f"job_{key}", metavar=key.upper(), help=text)
    parser.add_argument("--secret-env", action="append", default=[], metavar="NAME",
                        help="environment variable of the job whose value is taken from this "
                             "driver's environment and never printed or written (repeatable)")
    if launch:
        parser.add_argument("--detach", action="store_true",
                            help="return once the job started on every node")
        parser.add_argument("--on-interrupt", choices=["stop", "detach"], default="stop",
                            help="on Ctrl-C: stop the job on every node (default) or leave it "
                                 "running detached")
    _common(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- script [args...] (script relative to --code-src)")


def _run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", help="the run id (see `torchherd runs`)")
    parser.add_argument("-i", "--inventory",
                        help="Ansible inventory (default: the one the run was launched with)")
    _common(parser)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-dir", dest="runs_dir", metavar="DIR",
                        help="directory of runs/<run_id>/ (default runs)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="show Ansible's own output instead of the progress (-vv... more)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchherd", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, text: str) -> argparse.ArgumentParser:
        # No abbreviated flags: --nproc must not pass for --nproc-per-node silently.
        return sub.add_parser(name, help=text, description=text, allow_abbrev=False)

    _job_args(action("launch", "verify the nodes, sync, start torchrun, watch, collect"),
              launch=True)
    _job_args(action("verify", "preflight only: check every node, start nothing"),
              launch=False)
    _run_args(action("status", "the job's state on every node of a run"))
    _run_args(action("stop", "stop a run's job on every node, then collect"))
    _run_args(action("collect", "fetch a run's logs and artifacts, write summary.json"))
    logs = action("logs", "every node's log, lines prefixed with host and rank")
    _run_args(logs)
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep fetching and printing new lines while the job runs")
    logs.add_argument("--interval", type=float, default=3.0,
                      help="seconds between fetches with --follow (default 3)")
    logs.add_argument("--no-fetch", dest="fetch", action="store_false",
                      help="print what was fetched before; touch no node")
    runs = action("runs", "list past runs: id, state, start, nodes, reason")
    runs.add_argument("--runs-dir", dest="runs_dir", metavar="DIR",
                      help="directory of runs/<run_id>/ (default runs)")
    runs.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    return parser


def environ_secrets(names: list[str]) -> dict[str, str]:
    """secret_env values from this process's environment: a value on our command line would
    be readable by every user in /proc."""
    missing = [n for n in names if n not in os.environ]
    if missing:
        raise JobSpecError(f"--secret-env {missing[0]}: expected {missing[0]} in the driver's "
                           f"environment, found it unset; export it before running torchherd")
    return {n: os.environ[n] for n in names}


def job_from(args: argparse.Namespace) -> dict[str, Any]:
    """The job spec from the job file and the flags (flags win; -e and --secret-env add to
    the file's variables); validated."""
    job = read_job_file(args.job) if args.job else {}
    job.update({k.removeprefix("job_"): v for k, v in vars(args).items()
                if k.startswith("job_") and v is not None})
    for dest, items in vars(args).items():
        if dest.startswith("pairs_") and items:
            key = dest.removeprefix("pairs_")
            job[key] = {**_dict(job.get(key)), **_pairs(_flag(key), items)}
    if args.secret_env:
        job["secret_env"] = {**_dict(job.get("secret_env")), **environ_secrets(args.secret_env)}
    if getattr(args, "detach", False):
        job["detach"] = True
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if command:
        job.update(script=command[0], args=command[1:])
    if not job.get("script"):
        raise JobSpecError("job key 'script': required (str); give it after -- or in the job "
                           "file")
    return validate(job)


def _pairs(flag: str, items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise JobSpecError(f"{flag} {item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _program() -> str:
    return "python -m driver" if sys.argv[0].endswith("__main__.py") else "torchherd"


class Ui:
    """stderr: a live table on a terminal, plain lines otherwise; stdout: data only."""

    def __init__(self, verbose: int = 0) -> None:
        self.err = Console(stderr=True, highlight=False)
        self.verbose = verbose

    def say(self, text: str, style: str = "") -> None:
        self.err.print(f"[{style}]{escape(text)}[/]" if style else escape(text), soft_wrap=True)

    def drive(self, start: Callable[[], api.RunHandle], *, cancel_note: str) -> RunResult:
        """Start a run and show its progress until it ends. SIGINT and SIGTERM (also one that
        comes while it starts) cancel it once; later ones only say that it is being settled,
        so that it is never left half-way."""
        handle: api.RunHandle | None = None
        wanted = False

        def on_signal(_signum: int, _frame: Any) -> None:
            nonlocal wanted
            if wanted:
                self.say("torchherd: already cancelling; waiting for it to finish", "yellow")
                return
            wanted = True
            self.say(f"torchherd: cancelling ({cancel_note})", "yellow")
            if handle is not None:
                handle.cancel()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        live = None
        try:
            handle = start()
            if wanted:
                handle.cancel()
            self.say(f"torchherd: {handle.action} {handle.run_id} (on Ctrl-C {cancel_note})")
            progress = Progress(f"torchherd {handle.action} {handle.run_id}")
            if self.err.is_terminal and not self.verbose:
                live = Live(progress.table(), console=self.err, auto_refresh=False,
                            transient=True)
                live.start()
            for event in handle.events():
                lines = progress.update(event)
                if self.verbose:  # Ansible's own words instead (secret values masked)
                    lines = [event["stdout"]] if event.get("stdout") else []
                if live:
                    live.update(progress.table(), refresh=True)
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
            self.err.print(_table(result))
        for problem in result.problems:
            self.say(f"  {problem['host']}: {problem['check']}: expected {problem['expected']}, "
                     f"found {problem['found']}; fix: {problem.get('fix', '')}", "red")
        style = "green" if result.ok else "red"
        self.say(f"run {result.run_id} {result.state}: {result.reason}", style)
        if result.run_dir.exists():
            self.say(f"run directory: {result.run_dir}")
        if as_json:
            sys.stdout.write(json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
            sys.stdout.flush()
        return int(result.exit_code)


def _table(result: RunResult) -> Table:
    table = Table(title=f"run {result.run_id}: {result.state}", title_justify="left")
    for col in ("node", "rank", "state", "exit", "last line / error"):
        table.add_column(col, overflow="fold")
    for host, h in result.hosts.items():
        last = parse_line(host, h.get("node_rank"), result.static_nproc, h.get("last_line") or "")
        note = h.get("exception") or h.get("error") or last.short
        style = {"succeeded": "green", "running": "cyan", "stopped": "yellow"}.get(
            h.get("state") or "", "red")
        exit_code = h.get("exit_code")
        table.add_row(escape(host), str(h.get("node_rank")), f"[{style}]{h.get('state')}[/]",
                      "-" if exit_code is None else str(exit_code), escape(note))
    return table


def _launch(args: argparse.Namespace, ui: Ui) -> int:
    job = job_from(args)
    if args.action == "verify":
        result = ui.drive(lambda: api.verify_async(job, args.inventory, runs_dir=args.runs_dir,
                                                   verbosity=args.verbose),
                          cancel_note="nothing was started")
        return ui.report(result, args.json)
    fate = ("the job is stopped on every node" if args.on_interrupt == "stop" else
            "the job is left running, detached")
    result = ui.drive(lambda: api.launch_async(job, args.inventory, runs_dir=args.runs_dir,
                                               on_interrupt=args.on_interrupt,
                                               verbosity=args.verbose),
                      cancel_note=fate)
    code = ui.report(result, args.json)
    if result.state == "running":
        runs_dir = result.run_dir.parent
        ui.say(f"the job runs detached; follow it: {_program()} logs {result.run_id} --follow "
               f"--runs-dir {runs_dir}\nstop it: {_program()} stop {result.run_id} "
               f"--runs-dir {runs_dir}")
    return code


def _act(args: argparse.Namespace, ui: Ui) -> int:
    note = "stop can be run again" if args.action == "stop" else "nothing changes on the nodes"
    result = ui.drive(lambda: api.act_async(args.action, args.run_id, runs_dir=args.runs_dir,
                                            inventory=args.inventory, verbosity=args.verbose),
                      cancel_note=note)
    return ui.report(result, args.json)


def _logs(args: argparse.Namespace, ui: Ui) -> int:
    stream = api.logs(args.run_id, runs_dir=args.runs_dir, inventory=args.inventory,
                      follow=args.follow, interval=args.interval, fetch=args.fetch)
    lines = []
    try:
        for line in stream:
            if args.json:
                lines.append(dataclasses.asdict(line))
            else:
                sys.stdout.write(f"{line}\n")
                sys.stdout.flush()
    except KeyboardInterrupt:
        return Exit.CANCELLED
    if args.json:
        sys.stdout.write(json.dumps({"run_id": args.run_id, "lines": lines}, indent=2) + "\n")
    result = stream.result
    if result is None:
        return Exit.OK
    if not result.ok:
        ui.say(f"run {result.run_id} {result.state}: {result.reason}", "red")
    return int(result.exit_code)


def _runs(args: argparse.Namespace, ui: Ui) -> int:
    found = api.runs(args.runs_dir)
    if args.json:
        sys.stdout.write(json.dumps({"runs": [r.to_dict() for r in found]}, indent=2) + "\n")
        return Exit.OK
    table = Table(box=None, pad_edge=False)
    for col in ("run id", "state", "started", "nodes", "reason"):
        table.add_column(col, overflow="fold")
    for r in found:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started_at)) \
            if r.started_at else "-"
        table.add_row(r.run_id, r.state, started, ",".join(r.nodes), escape(r.reason))
    Console(highlight=False, soft_wrap=True).print(table)
    return Exit.OK


_ACTIONS: dict[str, Callable[[argparse.Namespace, Ui], int]] = {
    "launch": _launch, "verify": _launch, "status": _act, "stop": _act, "collect": _act,
    "logs": _logs, "runs": _runs,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ui = Ui(getattr(args, "verbose", 0))
    try:
        return _ACTIONS[args.action](args, ui)
    except UsageError as exc:
        ui.say(f"torchherd: {exc}", "red")
        return Exit.USAGE
