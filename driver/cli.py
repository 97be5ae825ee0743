# PYTHON_ARGCOMPLETE_OK
"""torchherd: launch and inspect multi-node torchrun jobs (python -m driver, or torchherd).

Data goes to stdout (--json: one JSON document, also for a usage error), messages and progress
to stderr: a live per-node table on a terminal, plain lines otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import argcomplete
from argcomplete.completers import ChoicesCompleter
from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

import driver
from driver import api
from driver.logs import parse_line
from driver.paths import driver_version
from driver.progress import Progress, facts_cells
from driver.prune import parse_duration
from driver.result import Exit, RunResult, UsageError, usage_document
from driver.spec import (
    JobSpecError,
    coerce,
    job_options,
    nproc_problem,
    read_job_file,
    validate,
)

# Job keys with flags of their own shape (script and args come after --; --runs-dir is
# common to every action).
_SPECIAL_KEYS = {"script", "args", "secret_env", "detach", "runs_dir"}
_MARKUP = re.compile(r"[CIOV]\(([^)]*)\)")
RUNS_DIR_ENV = "TORCHHERD_RUNS_DIR"
# How often the live table wants word of a running job (seconds): the schedule shortens the
# watch's rounds to it where one wait speaks for the job, one task on the master per round.
LIVE_PROGRESS_EVERY = 5.0

_EXIT_MEANINGS = {
    Exit.OK: "done (launch --detach: the job is running)",
    Exit.ERROR: "failed in a way none of the codes below names; see the message",
    Exit.USAGE: "bad flags, job spec or run id; nothing was started",
    Exit.PREFLIGHT_FAILED: "a preflight check failed on a node; nothing was started",
    Exit.JOB_FAILED: "the job failed, or a launch was stopped from elsewhere",
    Exit.NODE_UNREACHABLE: "a node was unreachable, or lost while the job ran",
    Exit.TIMEOUT: "the job ran past its timeout and was stopped",
    Exit.HUNG: "no rank made progress for hang_timeout s; stacks in the run's stacks/",
    Exit.CANCELLED: "cancelled by Ctrl-C or SIGTERM",
}


def _version() -> str:
    return driver_version() or "unknown (a checkout that was never installed)"


def _epilog() -> str:
    codes = "\n".join(f"  {int(code):>3}  {code.name.lower():<17} {_EXIT_MEANINGS[code]}"
                      for code in Exit)
    return (f"exit codes (--json: exit_code, exit_name):\n{codes}\n\n"
            f"environment:\n"
            f"  {RUNS_DIR_ENV:<26}  default of --runs-dir\n"
            f"  {'TORCHHERD_COLLECTIONS_PATH':<26}  directory holding ansible_collections/ "
            f"(default: torchherd's own)\n\n"
            f"shell completion (bash, zsh): eval \"$(register-python-argcomplete torchherd)\"")


# ansible-playbook's way of giving a job (-e @job.yml, --extra-vars) is not the driver's.
_JOB_FILE_HINT = ("torchherd takes the job file with -j/--job FILE (and each job key as a flag); "
                  "-e is --env NAME=VALUE, an environment variable of the job")


_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


class _Parser(argparse.ArgumentParser):
    """argparse's usage errors raised as UsageError, so that --json reports them too; an
    unknown flag gets the closest known one (Python 3.11's argparse suggests none)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.flags: list[str] = []  # before argparse adds its own --help
        self.commands: dict[str, _Parser] = {}
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flags += action.option_strings
        return action

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            # Reported by the action's own parser: its usage line, its flags.
            where = self.commands.get(getattr(namespace, "action", None), self)
            where.error(f"unrecognized arguments: {' '.join(extras)}{where.hint(extras)}")
        return namespace

    def hint(self, unknown: list[str]) -> str:
        for word in unknown:
            flag = word.partition("=")[0]
            if flag == "--extra-vars":
                return f" ({_JOB_FILE_HINT})"
            close = difflib.get_close_matches(flag, self.flags, n=1) if flag[:2] == "--" else []
            if close:
                return f"; did you mean {close[0]}?"
        return ""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        wrong = _INVALID_CHOICE.search(message)
        # Actions are short words: a looser match would offer `logs` for `bogus`.
        close = difflib.get_close_matches(wrong.group(1), re.findall(r"'([^']*)'", wrong.group(2)),
                                          n=1, cutoff=0.75) if wrong else []
        if close:  # an action's name, typo'd
            message += f"; did you mean {close[0]}?"
        raise UsageError(f"{message}; see {self.prog} --help")


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _shown(value: Any) -> str:
    """A job spec default as a job file spells it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def _job_args(parser: argparse.ArgumentParser, launch: bool) -> None:
    """Flags for the job keys, generated from the job spec (the one definition). They default
    to None, not to the spec's default, so that a flag not given leaves the job file's value;
    the help shows the spec's default."""
    parser.add_argument("-i", "--inventory", required=True, help="Ansible inventory of the nodes")
    parser.add_argument("-j", "--job", metavar="FILE",
                        help="job spec YAML (torchherd_job: or its keys); flags override it")
    for key, opt in job_options().items():
        if key in _SPECIAL_KEYS:
            continue
        notes = ["repeat for several"] if opt.get("type") in ("list", "dict") else []
        if opt.get("default") not in (None, "", [], {}):
            notes.append(f"default: {_shown(opt['default'])}")
        text = _MARKUP.sub(r"\1", opt.get("description", ""))
        if notes:
            text += f" ({'; '.join(notes)})"
        text = text.replace("%", "%%")  # argparse %-formats help texts
        if opt.get("type") == "list":
            parser.add_argument(_flag(key), dest=f"job_{key}", action="append", metavar="VALUE",
                                help=text)
        elif opt.get("type") == "dict":
            names = ["-e", _flag(key)] if key == "env" else [_flag(key)]
            parser.add_argument(*names, dest=f"pairs_{key}", action="append", default=[],
                                metavar="KEY=VALUE", help=text)
        else:
            # Choices are shown and completed; the value is checked and coerced as the job
            # file's would be, and a bad one named by the flag the user typed.
            choices = opt.get("choices") or (["true", "false"] if opt.get("type") == "bool"
                                             else None)
            flag = parser.add_argument(
                _flag(key), dest=f"job_{key}", help=text, type=_checked(key),
                metavar="{" + ",".join(map(str, choices)) + "}" if choices else key.upper())
            if choices:
                flag.completer = ChoicesCompleter(choices)
    parser.add_argument("--secret-env", action="append", default=[], metavar="NAME",
                        help="environment variable of the job whose value is taken from this "
                             "driver's environment and never printed or written (repeat for "
                             "several)")
    if launch:
        parser.add_argument("--detach", action="store_true",
                            help="return once the job started on every node")
        parser.add_argument("--on-interrupt", choices=["stop", "detach"], default="stop",
                            help="on Ctrl-C: stop the job on every node, or leave it running "
                                 "detached (default: %(default)s)")
    _common(parser, job=True)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- script [args...] (script relative to --code-src)")


def _checked(key: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return coerce(key, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = key  # argparse's fallback message names the type by it
    return convert


def _complete_run_ids(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    return [r.run_id for r in api.runs(getattr(parsed_args, "runs_dir", None))]


def _run_args(parser: argparse.ArgumentParser) -> None:
    run_id = parser.add_argument("run_id", help="the run id (see `torchherd runs`)")
    run_id.completer = _complete_run_ids
    parser.add_argument("-i", "--inventory",
                        help="Ansible inventory (default: the one the run was launched with)")
    _common(parser)


def _common(parser: argparse.ArgumentParser, *, job: bool = False, verbose: bool = True) -> None:
    fallback = "the job file's runs_dir, else runs" if job else "runs"
    parser.add_argument("--runs-dir", dest="runs_dir", metavar="DIR",
                        default=os.environ.get(RUNS_DIR_ENV) or None,
                        help=f"directory of runs/<run_id>/ (default: ${RUNS_DIR_ENV}, else "
                             f"{fallback})")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    if verbose:
        parser.add_argument("-v", "--verbose", action="count", default=0,
                            help="show Ansible's own output instead of the progress (-vv... "
                                 "more)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="torchherd", description=__doc__, epilog=_epilog(), allow_abbrev=False,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def action(name: str, text: str, *examples: str) -> argparse.ArgumentParser:
        lines = "\n".join(f"  %(prog)s {example}".rstrip() for example in examples)
        # No abbreviated flags: --nproc must not pass for --nproc-per-node silently.
        parser.commands[name] = sub.add_parser(
            name, help=text, description=text, allow_abbrev=False, epilog=f"examples:\n{lines}",
            formatter_class=argparse.RawDescriptionHelpFormatter)
        return parser.commands[name]

    _job_args(action("launch", "verify the nodes, sync, start torchrun, watch, collect",
                     "-i inventories/cluster.ini --nproc-per-node auto -- examples/train_ddp.py "
                     "--epochs 10",
                     "-i inventories/local.ini -j job.yml --detach --json"),
              launch=True)
    _job_args(action("verify", "preflight only: check every node, start nothing",
                     "-i inventories/cluster.ini -j job.yml"),
              launch=False)
    _run_args(action("status", "the job's state on every node of a run",
                     "RUN_ID", "RUN_ID --json"))
    _run_args(action("stop", "stop a run's job on every node, then collect", "RUN_ID"))
    _run_args(action("collect", "fetch a run's logs and artifacts, write summary.json",
                     "RUN_ID -i inventories/cluster.ini"))
    _run_args(action("stacks", "every rank's Python stack on every node; the job runs on",
                     "RUN_ID", "RUN_ID --json"))
    logs = action("logs", "every node's log, lines prefixed with host and rank",
                  "RUN_ID --follow", "RUN_ID --no-fetch > all-nodes.log")
    _run_args(logs)
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep fetching and printing new lines while the job runs")
    logs.add_argument("--interval", type=float, default=3.0,
                      help="seconds between fetches with --follow (default: %(default)s)")
    logs.add_argument("--no-fetch", dest="fetch", action="store_false",
                      help="print what was fetched before; touch no node")
    runs = action("runs", "list past runs: id, state, start, nodes, reason; with --prune, "
                          "remove old ones (a dry run without --yes)",
                  "", "--json --runs-dir ~/torchherd-runs",
                  "--prune --keep 10 -i inventories/cluster.ini",
                  "--prune --older-than 7d --yes")
    # Prune: old runs' directories on the controller, and with -i on their nodes
    # (<root>/runs/<run_id>); a run whose job still runs on any node stays.
    runs.add_argument("--prune", action="store_true",
                      help="remove the directories of the runs the keep policy lets go, on "
                           "the controller and (with -i) on their nodes; a run whose job still "
                           "runs stays; without --yes only shows what would go")
    runs.add_argument("--keep", type=int, metavar="N", help="with --prune: keep the N newest runs")
    runs.add_argument("--older-than", metavar="DURATION",
                      help="with --prune: remove only runs started longer ago than DURATION "
                           "(7d, 12h, 30m, 90s, 2w, 1d12h); with --keep, a run goes only where "
                           "both let it")
    runs.add_argument("-i", "--inventory",
                      help="with --prune: Ansible inventory of the runs' nodes; their run "
                           "directories go too, and the nodes say whether a job still runs "
                           "(without it: the controller's directories only, and a run that may "
                           "still run stays)")
    runs.add_argument("--yes", action="store_true",
                      help="with --prune: really remove (default: a dry run)")
    _common(runs)
    init = action("init", "write a job file, inventories and examples to start from",
                  "", "my-project --force")
    init.add_argument("dir", nargs="?", default=".",
                      help="directory to write into, created if missing (default: .)")
    init.add_argument("--force", action="store_true", help="overwrite files already there")
    init.set_defaults(json=False)
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
    the file's variables), checked. Defaults are not filled in: the keys left out come from
    the inventory's job, else from the defaults (driver.api)."""
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
    if args.job:
        # The flags' values were checked as argparse read them: what is left is the file's.
        validate(job, f"job file {args.job}")
        problem = nproc_problem(job.get("nproc_per_node", "auto"))
        if problem:
            raise JobSpecError(f"job file {args.job}: {problem}; fix: set it to the GPUs per "
                               f"node, or auto")
    return job


def _pairs(flag: str, items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep and item.startswith("@"):
            raise JobSpecError(f"{flag} {item!r}: expected KEY=VALUE, found a file; "
                               f"{_JOB_FILE_HINT}")
        if not sep or not key:
            raise JobSpecError(f"{flag} {item!r}: expected KEY=VALUE")
        pairs[key] = value
    return pairs


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _program() -> str:
    # python -m driver, or python -m torchherd: the package whose __main__ runs
    main = Path(sys.argv[0])
    return f"python -m {main.parent.name}" if main.name == "__main__.py" else "torchherd"


def _console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal:
        # Rich folds tables to 80 columns when no terminal tells it the width; piped output
        # (a file, grep) must keep a run id or a host name on one line.
        console.width = sys.maxsize
    return console


def _print_json(document: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


class Ui:
    """stderr: a live table on a terminal, plain lines otherwise; stdout: data only."""

    def __init__(self, verbose: int = 0) -> None:
        self.err = _console(stderr=True)
        self.verbose = verbose

    @property
    def live(self) -> bool:
        """Whether a run's progress is a live table (else plain lines, or Ansible's own)."""
        return self.err.is_terminal and not self.verbose

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
            _print_json(result.to_dict())
        return int(result.exit_code)


def _table(result: RunResult) -> Table:
    table = Table(title=f"run {result.run_id}: {result.state}", title_justify="left")
    for col in ("node", "rank", "state", "exit", "last line / error"):
        table.add_column(col, overflow="fold")
    for host, h in result.hosts.items():
        last = parse_line(host, h.get("node_rank"), result.static_nproc, h.get("last_line") or "")
        note = h.get("exception") or h.get("error") or last.short
        style = {"succeeded": "green", "running": "cyan", "stopped": "yellow",
                 "standby": "yellow"}.get(h.get("state") or "", "red")
        exit_code = h.get("exit_code")
        rank = str(h.get("node_rank")) + (" (standby)" if h.get("standby") else "")
        table.add_row(escape(host), rank, f"[{style}]{h.get('state')}[/]",
                      "-" if exit_code is None else str(exit_code), escape(note))
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
                                               verbosity=args.verbose,
                                               launched_at=driver.STARTED_AT,
                                               progress_every=LIVE_PROGRESS_EVERY if ui.live
                                               else 0),
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


def _stacks(args: argparse.Namespace, ui: Ui) -> int:
    """The report on stdout (the data asked for), the verdict on stderr; --json: the document."""
    result = ui.drive(lambda: api.act_async("stacks", args.run_id, runs_dir=args.runs_dir,
                                            inventory=args.inventory, verbosity=args.verbose),
                      cancel_note="nothing changes on the nodes")
    found = result.stacks
    if found and not args.json:
        sys.stdout.write(Path(found["text"]).read_text(encoding="utf-8"))
        sys.stdout.flush()
    if found:
        ui.say(f"stacks: {found['summary']} ({found['text']})",
               "red" if not result.ok else "yellow" if found["odd"] else "green")
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
        _print_json({"run_id": args.run_id, "lines": lines})
    result = stream.result
    if result is None:
        return Exit.OK
    if not result.ok:
        ui.say(f"run {result.run_id} {result.state}: {result.reason}", "red")
    return int(result.exit_code)


def _runs(args: argparse.Namespace, ui: Ui) -> int:
    if args.prune:
        return _prune(args, ui)
    given = [flag for flag, value in (("--keep", args.keep), ("--older-than", args.older_than),
                                      ("-i", args.inventory), ("--yes", args.yes or None))
             if value is not None]
    if given:
        raise UsageError(f"runs {given[0]}: expected it with --prune, found no --prune")
    found = api.runs(args.runs_dir)
    if args.json:
        _print_json({"runs": [r.to_dict() for r in found]})
        return Exit.OK
    table = Table(box=None, pad_edge=False)
    for col in ("run id", "state", "started", "nodes", "reason"):
        table.add_column(col, overflow="fold")
    for r in found:
        table.add_row(r.run_id, r.state, _when(r.started_at), ",".join(r.nodes), escape(r.reason))
    _console().print(table)
    return Exit.OK


def _when(started_at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started_at)) if started_at else "-"


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return ""


def _prune(args: argparse.Namespace, ui: Ui) -> int:
    """The runs the policy lets go on stdout (removed, or kept and why); totals on stderr."""
    older_than = parse_duration(args.older_than) if args.older_than is not None else None
    try:
        report = api.prune(args.runs_dir, keep=args.keep, older_than=older_than,
                           inventory=args.inventory, remove=args.yes,
                           on_event=(lambda e: ui.say(e["stdout"]) if e.get("stdout") else None)
                           if args.verbose else None, verbosity=args.verbose)
    except KeyboardInterrupt:
        ui.say("torchherd: prune cancelled; run it again to finish (what is gone stays gone)",
               "yellow")
        return Exit.CANCELLED
    gone = "would remove" if report.dry_run else "removed"
    if args.json:
        _print_json(report.to_dict())
    else:
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
        _console().print(table)
    totals = report.totals()
    where = (f" and {totals['node_dirs']} run directories on nodes "
             f"({_size(totals['node_bytes'])})" if report.nodes_asked else
             " (nodes not asked: give -i INVENTORY to prune there too)")
    ui.say(f"{gone} {totals['runs']} runs ({_size(totals['bytes'])} on the controller){where}; "
           f"kept {totals['kept']} of the {len(report.runs)} runs the policy let go",
           "green" if report.exit_code == Exit.OK else "red")
    if report.reason:
        ui.say(report.reason, "red")
    if report.dry_run and totals["runs"]:
        ui.say("dry run: nothing was removed; add --yes to remove them", "yellow")
    return int(report.exit_code)


def _init(args: argparse.Namespace, ui: Ui) -> int:
    from driver import scaffold  # it reads the job spec: only this action needs it

    for path in scaffold.init(args.dir, force=args.force):
        sys.stdout.write(f"{path}\n")
    # verify first: it shows the nodes (and a Python without torch) before anything starts.
    ui.say(f"wrote a job file, inventories and examples; next: cd {args.dir} && "
           f"{_program()} verify -i inventories/local.ini -j {scaffold.JOB_FILE}, then launch")
    return Exit.OK


_ACTIONS: dict[str, Callable[[argparse.Namespace, Ui], int]] = {
    "launch": _launch, "verify": _launch, "status": _act, "stop": _act, "collect": _act,
    "stacks": _stacks,
    "logs": _logs, "runs": _runs, "init": _init,
}


def _json_asked(argv: list[str]) -> bool:
    """--json among torchherd's own flags (one after -- belongs to the script)."""
    return "--json" in (argv[:argv.index("--")] if "--" in argv else argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    argcomplete.autocomplete(parser)
    args: argparse.Namespace | None = None
    try:
        args = parser.parse_args(argv)
        return _ACTIONS[args.action](args, Ui(getattr(args, "verbose", 0)))
    except UsageError as exc:
        Ui().say(f"torchherd: {exc}", "red")
        if args.json if args else _json_asked(argv):
            action = args.action if args else next(iter(argv), None)
            _print_json(usage_document(action if action in _ACTIONS else None, str(exc)))
        return Exit.USAGE
