# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The torchrun_job module's state=waiting: wait for the job's end on this node (or on every
node of the master's gang), the timeout, a change in the node's activity (the hang watch), or
(for a live view) a change in the nodes' last lines; once the job has ended here, remove the
run's firewall rules in the same call."""

from __future__ import annotations

import os
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import (
    Runner,
    close_rules,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.report import report
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    job_line,
    last_activity,
    read_state,
    sleep_until_gone,
    supervisor_alive,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    declared_hang,
    note_hang,
    read_record,
    rules_closed,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record

# How often a wait for the nodes' lines looks at them (the record, or this node's log).
LINES_LOOK = 0.25


def wait(module, p, paths, timeout):
    """Wait until the job ends here (with p.gang: on every node of the master's gang), the
    timeout passes, with p.hang the node's activity changes or, with p.lines, p.lines seconds
    passed and the nodes' last lines changed since the wait began; the result's fields."""
    began = time.monotonic()
    deadline = began + timeout
    hang = p["hang"]
    lines = p.get("lines") or 0
    # The lines as the wait begins stand for those the last wait returned: a line that changed
    # in between (the answer's way back and the next call, a fraction of a second) shows with
    # the next change, or at the round's end.
    told = _lines(paths, p["gang"]) if lines else None
    formed = None
    while True:
        left = deadline - time.monotonic()
        state = read_state(paths)["state"]
        if left <= 0 or state != "running":
            break
        if hang and _quiet_changed(paths, hang):
            break
        if p["gang"]:
            # The master alone speaks for every node only where every node joined its gang;
            # else the wait returns at once (gang_complete false), for a watch of every node.
            formed = _gang(paths)
            if formed is None:
                sleep_until_gone(paths, min(left, 0.5))
                continue
            if formed.get("joined", 0) < formed.get("expected", 1):
                break
        if _lines_news(paths, p, began, told):
            break
        # Watching for a hang looks at the node's output every second (a stat or two), for
        # the lines a read of the record (or of the log's tail) four times a second.
        sleep_until_gone(paths, min(left, LINES_LOOK if lines else 1.0 if hang else 30.0))
    extra = {}
    if p["gang"]:
        formed = formed or _gang(paths)
        extra["gang_complete"] = bool(formed) and formed.get("joined", 0) >= formed.get("expected", 1)
        if formed and not extra["gang_complete"]:
            extra["gang_formed"] = formed
    # The gang's end: on the master, its supervisor stays until every node's launcher ended
    # (the other nodes' lines still come while it waits).
    while p["gang"] and extra["gang_complete"] and state != "running" and supervisor_alive(paths):
        left = deadline - time.monotonic()
        if left <= 0 or _lines_news(paths, p, began, told):
            break
        sleep_until_gone(paths, min(left, LINES_LOOK if lines else 30.0), which="supervisor")
    if p["gang"]:
        extra["gang_ended"] = (extra["gang_complete"] and state != "running"
                               and not supervisor_alive(paths))
        # The nodes the master's gang lost (their links closed without an exit): the launch
        # does not try them again.
        extra["gang_lost"] = ((_gang(paths) or {}).get("lost") or []
                              if extra["gang_ended"] else [])
        # Every node's last line as the master heard it (after the gang's end: the last words).
        extra["nodes"] = _lines(paths, True)
        if not extra["gang_ended"]:
            state = "running"  # for the rules below: the job is not over everywhere yet
    if hang:
        extra["activity"] = _activity(module, paths, hang)
    # Once the job has ended here, its rules go in this same call (no teardown round trip).
    if p["firewall"] is not None and state != "running" and not module.check_mode:
        closed = close_firewall(module, p, paths)
        return report(paths, changed=closed["changed"], firewall=closed, **extra)
    return report(paths, **extra)


def _quiet_changed(paths, hang):
    """Whether the wait must return for the hang watch: the node went quiet (no output for
    hang.timeout s) while the controller thinks it active, or made progress since the quiet
    spell the controller knows of (hang.quiet_since), or the job was declared hung."""
    if os.path.exists(paths["hung"]):
        return True
    last = last_activity(paths)
    if last is None:
        return False
    if hang["quiet_since"]:
        return last > hang["quiet_since"]
    return time.time() - last >= hang["timeout"]


def _activity(module, paths, hang):
    """What the hang watch saw on this node, for the answer and, where the job has a run
    directory here, for the record's hang section: the node's last progress (its clock), how
    long it has been quiet, whether that is the hang timeout or more, and the hang once
    declared (the `hung` file's time)."""
    now = time.time()
    last = last_activity(paths)
    declared = declared_hang(paths)
    activity = {"last": last, "quiet": last is not None and now - last >= hang["timeout"],
                "hung": declared is not None}
    if not module.check_mode and os.path.isdir(paths["dir"]):
        seen = {"timeout": hang["timeout"], "quiet_since": hang["quiet_since"] or None,
                "last": last, "quiet": activity["quiet"], "noted_at": now,
                "quiet_for": None if last is None else round(now - last, 1)}
        if declared is not None:
            seen["declared_at"] = declared
        try:
            note_hang(paths, **seen)
        except OSError as exc:  # the answer still carries the word: the watch goes on
            module.warn(f"the hang watch's word was not written to the run's record: {exc}")
    return activity


def _lines_news(paths, p, began, told):
    """Whether the wait must return for a live view (p.lines): its seconds passed since the
    wait `began` and the lines are no longer those it was `told` at its start."""
    return bool(p.get("lines")) and time.monotonic() - began >= p["lines"] \
        and _lines(paths, p["gang"]) != told


def _lines(paths, gang):
    """The nodes' last lines: with the gang, every node's as the master's record keeps them
    (name -> last_line, at); else this node's own."""
    if gang:
        return dict(read_record(paths)["gang"].get("lines") or {})
    return job_line(paths["log"])


def _gang(paths):
    """The master's gang as its record has it, or None before it formed."""
    formed = read_record(paths)["gang"]
    return formed if "expected" in formed else None


def close_firewall(module, p, paths):
    """The run's rules removed here: by the supervisor already (the record says so), else now.
    What was removed, or the error, since a rule that could not be removed must not hide the
    job's own state."""
    fw = read_record(paths)["firewall"]
    if fw.get("closed_by") and not fw.get("error"):
        return {"changed": False, "closed_by": fw["closed_by"]}
    closed = close_rules(Runner(module), p["run_id"], p["firewall"])
    record(paths, "firewall", **rules_closed("wait", closed))
    if "error" in closed:
        module.warn(f"the rules of run {p['run_id']} could not be removed here: {closed['error']}")
    return closed
