"""torchherd's command line: python -m driver launch|verify ... (also installed as torchherd).

Data goes to stdout (--json gives one JSON document), messages and progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from driver.api import Exit, RunResult, launch, verify
from driver.progress import Progress
from driver.spec import JobSpecError, load_job


def _job_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--inventory", required=True, help="Ansible inventory of the nodes")
    parser.add_argument("-j", "--job", help="job spec YAML file (torchherd_job: or its keys)")
    parser.add_argument("--nproc-per-node", help="processes per node: an integer or auto")
    parser.add_argument("--node-group", help="inventory group of the nodes")
    parser.add_argument("--code-src", help="directory synced to every node (default .)")
    parser.add_argument("--python", help="the job's Python on the nodes")
    parser.add_argument("--master-port", type=int, help="rendezvous port (default 29500)")
    parser.add_argument("--run-id", help="run id (default: time and a random suffix)")
    parser.add_argument("--runs-dir", help="where runs/<run_id>/ go (default runs)")
    parser.add_argument("-e", "--env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment variable for the job (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="Ansible verbosity")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- script [args...] (script relative to --code-src)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchherd", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="action", required=True)
    _job_args(sub.add_parser("launch", help="verify the nodes, sync, start torchrun, watch, "
                                            "collect"))
    _job_args(sub.add_parser("verify", help="preflight only: check every node, start nothing"))
    return parser


def _job_from(args: argparse.Namespace) -> dict[str, Any]:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise JobSpecError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    overrides: dict[str, Any] = {
        "nproc_per_node": args.nproc_per_node, "node_group": args.node_group,
        "code_src": args.code_src, "python": args.python, "master_port": args.master_port,
        "run_id": args.run_id, "runs_dir": args.runs_dir,
    }
    if command:
        overrides.update(script=command[0], args=command[1:])
    if env:
        overrides["env"] = env
    job = load_job(args.job, **overrides)
    if not job.get("script"):
        raise JobSpecError("job key 'script': required; give it after -- or in the job file")
    return job


def _render(result: RunResult) -> Table:
    table = Table(title=f"run {result.run_id}: {result.state}", title_justify="left")
    for col in ("node", "rank", "state", "exit", "last line / error"):
        table.add_column(col, overflow="fold")
    for host, h in result.hosts.items():
        note = h.get("exception") or h.get("error") or h.get("last_line") or ""
        style = "green" if h.get("state") == "succeeded" else "red"
        table.add_row(host, str(h.get("node_rank")), f"[{style}]{h.get('state')}[/]",
                      "-" if h.get("exit_code") is None else str(h.get("exit_code")), escape(note))
    return table


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    err = Console(stderr=True, highlight=False)
    try:
        job = _job_from(args)
    except JobSpecError as exc:
        err.print(f"[red]torchherd: {escape(str(exc))}[/]")
        return Exit.USAGE

    cancel = threading.Event()
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(_signum: int, _frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        err.print("[yellow]torchherd: cancelling (Ctrl-C again to abort at once)[/]")
        cancel.set()

    signal.signal(signal.SIGINT, on_sigint)
    progress = Progress()
    try:
        live = Live(progress.table(), console=err, auto_refresh=False, transient=True) \
            if err.is_terminal else None

        def on_event(event: dict[str, Any]) -> None:
            line = progress.update(event)
            if live:
                live.update(progress.table(), refresh=True)
            elif line:
                err.print(line)

        if live:
            live.start()
        try:
            if args.action == "launch":
                result = launch(job, args.inventory, runs_dir=args.runs_dir, on_event=on_event,
                                cancel=cancel, verbosity=args.verbose)
            else:
                result = verify(job, args.inventory, runs_dir=args.runs_dir, on_event=on_event)
        finally:
            if live:
                live.stop()
    except JobSpecError as exc:
        err.print(f"[red]torchherd: {escape(str(exc))}[/]")
        return Exit.USAGE
    finally:
        signal.signal(signal.SIGINT, previous)

    if result.hosts:
        err.print(_render(result))
    colour = "green" if result.ok else "red"
    err.print(f"[{colour}]run {result.run_id} {result.state}: {escape(result.reason)}[/]")
    err.print(f"run directory: {result.run_dir}")
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    return int(result.exit_code)
