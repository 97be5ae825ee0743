"""Verdicts that must not lie: a launch cancelled before anything started, and stacks that
read nothing (py-spy missing on a node)."""

from __future__ import annotations

import json

from driver.result import DRIVER_FILE, Exit, cancel_verdict, run_info, stacks_verdict

HINT = "torchherd stop r1 --runs-dir runs"


def summary(state, **hosts):
    return {"state": state, "hosts": {h: {"state": s} for h, s in hosts.items()}}


def test_a_cancel_before_the_start_says_nothing_was_started():
    # What the stop after a Ctrl-C in preflight writes: no node has the job.
    state, reason = cancel_verdict(summary("unknown", a="absent", b="absent"), True, HINT)
    assert state == "cancelled"
    assert reason == "cancelled before the job started: nothing was started on any node"
    assert "stopped" not in reason


def test_a_cancel_after_the_start_says_it_was_stopped():
    state, reason = cancel_verdict(summary("stopped", a="stopped", b="stopped"), True, HINT)
    assert (state, reason) == ("stopped", "cancelled; the job was stopped on every node")
    # The start landed on one node only.
    state, reason = cancel_verdict(summary("unknown", a="stopped", b="absent"), True, HINT)
    assert state == "cancelled" and reason.endswith("on every node where it had started")


def test_a_node_the_stop_did_not_reach_is_named_with_the_way_to_stop_it():
    state, reason = cancel_verdict(summary("failed", a="stopped", b="unreachable"), True, HINT)
    assert state == "failed"
    assert "may still run on b (unreachable)" in reason and reason.endswith(HINT)


def test_detach_after_the_job_ended_says_so():
    state, reason = cancel_verdict(summary("succeeded", a="succeeded"), False, HINT)
    assert (state, reason) == ("succeeded", "cancelled; the job had already ended: succeeded")


def test_no_answer_at_all_is_not_called_nothing_started():
    state, reason = cancel_verdict(None, True, HINT)
    assert state == "cancelled" and "not known" in reason and HINT in reason


def test_runs_lists_a_cancelled_launch_as_cancelled(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"started_at": 1.0, "nodes": [{"host": "a"}]}))
    (tmp_path / "summary.json").write_text(json.dumps(summary("unknown", a="absent")))
    (tmp_path / DRIVER_FILE).write_text(json.dumps(
        {"inventory": "inv", "cancelled": {"state": "cancelled", "reason": "nothing started"}}))
    found = run_info(tmp_path)
    assert (found.state, found.reason) == ("cancelled", "nothing started")
    # A later summary with a verdict of its own (status after a relaunch) has the last word.
    (tmp_path / "summary.json").write_text(json.dumps(summary("succeeded", a="succeeded")))
    assert run_info(tmp_path).state == "succeeded"


PY_SPY_MISSING = ("py-spy: expected py-spy next to /venv/bin/python or on PATH, found neither; "
                  "fix: /venv/bin/python -m pip install py-spy into the job's environment on "
                  "every node (a static binary, no build)")


def test_stacks_without_py_spy_fail_naming_the_host_and_the_fix():
    report = {"summary": "no stack of the 2 ranks could be read", "groups": [],
              "errors": {"node1": PY_SPY_MISSING}}
    code, reason = stacks_verdict(report)
    assert code == Exit.ERROR
    assert reason.startswith("node1: py-spy: expected py-spy") and "pip install py-spy" in reason


def test_stacks_without_py_spy_on_every_node_say_the_fix_once():
    # The report's problems (plugins/filter/stacks.py): each error once, its fix apart.
    error = "py-spy: expected py-spy next to /venv/bin/python or on PATH, found neither"
    fix = ("/venv/bin/python -m pip install py-spy into the job's environment on every node (a "
           "static binary, no build)")
    report = {"summary": f"no stack of the 8 ranks could be read (node0, node1: {error})",
              "groups": [], "ranks": [{"rank": r} for r in range(8)],
              "errors": {"node0": error, "node1": error},
              "problems": [{"hosts": ["node0", "node1"], "ranks": [], "error": error, "fix": fix}]}
    assert stacks_verdict(report) == (Exit.ERROR, f"node0, node1: {error}; fix: {fix}")
    # Ranks whose stacks could not be read: the summary, and each fix once.
    ptrace = "py-spy needs to read the process's memory: run as the job's user"
    unread = dict(report, errors={}, summary="no stack of the 8 ranks could be read", problems=[
        {"hosts": ["node0"], "ranks": [0, 1, 2, 3], "error": "Permission denied", "fix": ptrace},
        {"hosts": ["node1"], "ranks": [4, 5, 6, 7], "error": "Permission denied", "fix": ptrace}])
    assert stacks_verdict(unread) == (
        Exit.ERROR, f"stacks: no stack of the 8 ranks could be read; fix: {ptrace}")

def test_stacks_fail_where_one_node_lacks_py_spy_even_if_others_answered():
    report = {"groups": [{"where": "f (a.py:1)", "ranks": [0, 1]}],
              "errors": {"node1": PY_SPY_MISSING}}
    assert stacks_verdict(report)[0] == Exit.ERROR


def test_stacks_read_everywhere_pass_and_ranks_without_a_stack_fail():
    assert stacks_verdict({"groups": [{"where": "f (a.py:1)", "ranks": [0]}],
                           "ranks": [{"rank": 0}], "errors": {}}) is None
    unread = {"summary": "no stack of the 1 ranks could be read", "groups": [],
              "ranks": [{"rank": 0, "error": "Permission denied"}], "errors": {}}
    assert stacks_verdict(unread) == (Exit.ERROR,
                                      "stacks: no stack of the 1 ranks could be read")
    # No rank yet (torchrun still starting its workers): said in the report, not a failure.
    assert stacks_verdict({"summary": "no rank of the job found", "groups": [], "ranks": [],
                           "errors": {}}) is None
    assert stacks_verdict(None)[0] == Exit.ERROR
