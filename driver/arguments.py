"""The torchherd command line: its parser, one subcommand per action, the job keys' flags
generated from the job spec, argparse's usage errors raised as UsageError; and the job that
the flags and the job file give."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from argcomplete.completers import ChoicesCompleter

from driver import actions, ansible_options
from driver.paths import driver_version
from driver.result import Exit, UsageError
from driver.spec import (
    JobSpecError,
    coerce,
    job_options,
    raw_problems,
    read_job_file,
    sub_keys,
    validate,
)

# What --help says of the program, above the actions.
DESCRIPTION = ("torchherd: launch and inspect multi-node torchrun jobs (python -m driver, or "
               "torchherd).\n\n"
               "Data goes to stdout (--json: one JSON document, also for a usage error), messages "
               "and progress\nto stderr: a live per-node table on a terminal, plain lines "
               "otherwise.\n")

# Job keys with flags of their own shape (script and args come after --; --runs-dir is
# common to every action).
_SPECIAL_KEYS = {"script", "args", "secret_env", "detach", "runs_dir"}
_MARKUP = re.compile(r"[CIOV]\(([^)]*)\)")
RUNS_DIR_ENV = "TORCHHERD_RUNS_DIR"

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
        if opt.get("options"):  # a mapping of its own keys: KEY=VALUE, each key named
            text += (". Its keys (KEY=VALUE, a list's items separated by commas): "
                     + "; ".join(sub_keys(key)))
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
    ansible_options.add_arguments(parser)
    if launch:
        parser.add_argument("--check", action="store_true",
                            help="not a launch: `torchherd verify` is the dry run (preflight on "
                                 "every node, nothing started)")
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
    return [r.run_id for r in actions.runs(getattr(parsed_args, "runs_dir", None))]


def _run_args(parser: argparse.ArgumentParser) -> None:
    run_id = parser.add_argument("run_id", help="the run id (see `torchherd runs`)")
    run_id.completer = _complete_run_ids
    parser.add_argument("-i", "--inventory",
                        help="Ansible inventory (default: the one the run was launched with)")
    _common(parser)
    # logs' -f is --follow: its forks are --forks alone.
    ansible_options.add_arguments(parser, short_forks=parser.prog.split()[-1] != "logs")


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
    parser = _Parser(prog="torchherd", description=DESCRIPTION, epilog=_epilog(),
                     allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    show = action("show", "one run as a single HTML page: every node's timeline, states, the "
                          "root cause and last lines, GPU/CPU/memory use; from what the "
                          "controller has (touches no node)",
                  "RUN_ID --open", "RUN_ID -o ~/reports/run.html --json")
    run_id = show.add_argument("run_id", help="the run id (see `torchherd runs`)")
    run_id.completer = _complete_run_ids
    show.add_argument("-o", "--output", metavar="FILE",
                      help="where to write the page (default: report.html in the run's "
                           "directory, beside summary.json)")
    show.add_argument("--open", action="store_true",
                      help="open the page in the browser (Python's webbrowser)")
    _common(show, verbose=False)
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
    ansible_options.add_arguments(runs)
    ps = action("ps", "who uses the nodes: the torchherd runs on each (any user's, any "
                      "controller's) and the GPU processes that are none of theirs",
                "-i inventories/cluster.ini", "-i inventories/cluster.ini -l gpu01 --json",
                "-i inventories/cluster.ini -b")
    ps.add_argument("-i", "--inventory", required=True,
                    help="Ansible inventory: every host of it is asked (-l: those it matches)")
    ps.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    ps.add_argument("-v", "--verbose", action="count", default=0,
                    help="show Ansible's own output (-vv... more)")
    ansible_options.add_arguments(ps)
    gone = action("disconnect", "close the SSH connections kept open to the nodes between runs "
                                "(a relaunch reuses them; each closes itself after its idle "
                                "time); nothing changes on the nodes",
                  "-i inventories/cluster.ini", "-i inventories/cluster.ini -l gpu01 --json")
    gone.add_argument("-i", "--inventory", required=True,
                      help="Ansible inventory: the connections to every host of it are closed "
                           "(-l: those it matches)")
    gone.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    gone.add_argument("-v", "--verbose", action="count", default=0,
                      help="show Ansible's own output (-vv... more)")
    ansible_options.add_arguments(gone)
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
    the inventory's job, else from the defaults (driver.inputs)."""
    job = read_job_file(args.job) if args.job else {}
    if args.job:  # what is wrong in the file is the file's, before any flag is laid over it
        validate(job, f"job file {args.job}")
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
    # A flag's plain value was checked as argparse read it; the KEY=VALUE pairs of a mapping
    # (--container, --venv, -e) are checked here, and named by their flags.
    pairs = [_flag(dest.removeprefix("pairs_")) for dest, items in vars(args).items()
             if dest.startswith("pairs_") and items]
    if pairs:
        validate(job, " ".join(pairs) + (f" over job file {args.job}" if args.job else ""))
    if args.job:
        problems = raw_problems(job)
        if problems:
            raise JobSpecError(f"job file {args.job}: {'; '.join(problems)}; fix: correct it "
                               f"there (`torchherd launch --help` lists every key)")
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
