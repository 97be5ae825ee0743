# PYTHON_ARGCOMPLETE_OK
"""The torchherd command (python -m driver, or torchherd): each action's handler, which calls
the API (driver.api) with what the flags say (driver.arguments) and shows what came of it
(driver.ui); and main, which maps a usage error to its exit code (and, with --json, its
document)."""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import gc
import sys
from collections.abc import Callable
from pathlib import Path

import argcomplete

import driver
from driver import ansible_options, api
from driver.arguments import build_parser, job_from
from driver.prune import parse_duration
from driver.result import Exit, UsageError, usage_document
from driver.ui import Ui, console, interrupt_on_signals, print_json, runs_table

# How often the live table wants word of a running job (seconds): the schedule shortens the
# watch's rounds to it where one wait speaks for the job, one task on the master per round.
LIVE_PROGRESS_EVERY = 5.0


def _program() -> str:
    # python -m driver, or python -m torchherd: the package whose __main__ runs
    main = Path(sys.argv[0])
    return f"python -m {main.parent.name}" if main.name == "__main__.py" else "torchherd"


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
        print_json({"run_id": args.run_id, "lines": lines})
    result = stream.result
    if result is None:
        return Exit.OK
    if not result.ok:
        ui.say(f"run {result.run_id} {result.state}: {result.reason}", "red")
    return int(result.exit_code)


def _show(args: argparse.Namespace, ui: Ui) -> int:
    """The page's path on stdout (--json: in a document), and opened with --open."""
    from driver import show  # its template engine: only this action needs it

    path, run = show.write(args.run_id, runs_dir=args.runs_dir, output=args.output)
    if args.json:
        print_json({"action": "show", "run_id": run.run_id, "run_dir": str(run.run_dir),
                    "state": run.state, "reason": run.reason, "page": str(path)})
    else:
        sys.stdout.write(f"{path}\n")
        sys.stdout.flush()
    if args.open:
        import webbrowser

        if not webbrowser.open(path.as_uri()):
            ui.say(f"torchherd: no browser found to open {path}; open it yourself", "yellow")
    return Exit.OK


def _runs(args: argparse.Namespace, ui: Ui) -> int:
    if args.prune:
        return _prune(args, ui)
    given = [flag for flag, value in (("--keep", args.keep), ("--older-than", args.older_than),
                                      ("-i", args.inventory), ("-l", args.limit),
                                      ("--yes", args.yes or None))
             if value is not None]
    if given:
        raise UsageError(f"runs {given[0]}: expected it with --prune, found no --prune")
    found = api.runs(args.runs_dir)
    if args.json:
        print_json({"runs": [r.to_dict() for r in found]})
        return Exit.OK
    console().print(runs_table(found))
    return Exit.OK


def _prune(args: argparse.Namespace, ui: Ui) -> int:
    """runs --prune: the keep policy applied (a dry run without --yes), then shown."""
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
    return ui.report_prune(report, args.json)


def _ps(args: argparse.Namespace, ui: Ui) -> int:
    """Who uses the nodes: the table (or --json's document) on stdout, as runs prints its list."""
    try:
        report = api.ps(args.inventory, verbosity=args.verbose,
                        on_event=(lambda e: ui.say(e["stdout"]) if e.get("stdout") else None)
                        if args.verbose else None)
    except KeyboardInterrupt:
        ui.say("torchherd: ps cancelled (nothing changes on the nodes)", "yellow")
        return Exit.CANCELLED
    return ui.report_ps(report, args.json)


def _disconnect(args: argparse.Namespace, ui: Ui) -> int:
    """The kept SSH connections to the nodes closed: a line (or --json's document) says so."""
    try:
        report = api.disconnect(args.inventory, verbosity=args.verbose,
                                on_event=(lambda e: ui.say(e["stdout"]) if e.get("stdout")
                                          else None) if args.verbose else None)
    except KeyboardInterrupt:
        ui.say("torchherd: disconnect cancelled (nothing changes on the nodes)", "yellow")
        return Exit.CANCELLED
    if args.json:
        print_json(report.to_dict())
    if report.reason:
        ui.say(f"disconnect: {report.reason}", "red")
    elif not args.json:
        ui.say(f"torchherd: the SSH connections kept open to the nodes of {report.inventory} "
               "are closed")
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
    "stacks": _stacks, "show": _show,
    "logs": _logs, "runs": _runs, "ps": _ps, "disconnect": _disconnect, "init": _init,
}


def _json_asked(argv: list[str]) -> bool:
    """--json among torchherd's own flags (one after -- belongs to the script)."""
    return "--json" in (argv[:argv.index("--")] if "--" in argv else argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # At the interpreter's exit, after the command's last word: no last garbage collection over
    # every object of the run, which took most of the 0.4 s between a launch's table and the
    # command's return (strace, a 2-node launch on a loaded machine); as for ansible-playbook
    # (driver.runner). Once, however often main runs in one process.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    parser = build_parser()
    argcomplete.autocomplete(parser)
    args: argparse.Namespace | None = None
    try:
        args = parser.parse_args(argv)
        if getattr(args, "check", False):
            raise UsageError("launch --check: expected a launch, found Ansible's dry-run flag; "
                             "fix: torchherd verify with the same flags is the dry run "
                             "(preflight on every node, nothing started)")
        ansible_options.apply(args)
        interrupt_on_signals()
        return _ACTIONS[args.action](args, Ui(getattr(args, "verbose", 0)))
    except UsageError as exc:
        Ui().say(f"torchherd: {exc}", "red")
        if args.json if args else _json_asked(argv):
            action = args.action if args else next(iter(argv), None)
            print_json(usage_document(action if action in _ACTIONS else None, str(exc)))
        return Exit.USAGE
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP where no run was being driven
        return Exit.CANCELLED
