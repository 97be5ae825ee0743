"""Exit codes and states from summary.json / preflight.json (driver.result.verdict)."""

import json

import pytest

from driver.result import Exit, read_result, run_info, verdict


def summary(state, *host_states, reason="r"):
    return {"state": state, "reason": reason,
            "hosts": {f"n{i}": {"state": s, "node_rank": i} for i, s in enumerate(host_states)}}


def gate(*problems):
    return {"gate": {"ok": not problems, "nproc_per_node": 2,
                     "problems": [{"host": h, "check": c, "expected": "e", "found": "f",
                                   "fix": "x"} for h, c in problems]}}


@pytest.mark.parametrize("action,summ,code", [
    ("launch", summary("succeeded", "succeeded", "succeeded"), Exit.OK),
    ("launch", summary("running", "running", "running"), Exit.OK),  # detach
    ("launch", summary("failed", "failed", "stopped"), Exit.JOB_FAILED),
    ("launch", summary("failed", "timed_out", "timed_out"), Exit.TIMEOUT),
    # A lost node explains the failures it caused on the others.
    ("launch", summary("failed", "failed", "lost"), Exit.NODE_UNREACHABLE),
    ("status", summary("failed", "succeeded", "unreachable"), Exit.NODE_UNREACHABLE),
    # Elastic: the group re-formed without the lost node and finished.
    ("launch", summary("succeeded", "succeeded", "lost"), Exit.OK),
    ("launch", summary("stopped", "stopped", "stopped"), Exit.JOB_FAILED),
    ("stop", summary("stopped", "stopped", "stopped"), Exit.OK),
    ("status", summary("stopped", "stopped", "succeeded"), Exit.OK),
    ("collect", summary("failed", "failed", "stopped"), Exit.JOB_FAILED),
])
def test_summary_states_map_to_exit_codes(action, summ, code):
    got, state, reason = verdict(action, summ, gate(), True, 0, "msg")
    assert (got, state, reason) == (code, summ["state"], "r")


def test_a_failed_playbook_is_no_success_even_with_a_good_summary():
    assert verdict("launch", summary("succeeded", "succeeded"), None, True, 2, "boom") == (
        Exit.ERROR, "succeeded", "boom")


def test_preflight_failure_and_unreachable_node():
    code, state, reason = verdict("launch", None, gate(("n1", "gpus")), True, 2, "m")
    assert (code, state) == (Exit.PREFLIGHT_FAILED, "preflight_failed")
    assert reason == "n1: gpus: expected e, found f"
    code, _state, reason = verdict("launch", None, gate(("n0", "torch"), ("n1", "ssh")),
                                   True, 2, "m")
    assert code == Exit.NODE_UNREACHABLE and "n1: ssh" in reason


def test_status_of_a_run_stopped_in_preflight_keeps_the_preflight_verdict():
    absent = summary("unknown", "absent", "absent")
    assert verdict("status", absent, gate(("n0", "nccl")), True, 0, "m")[0] == \
        Exit.PREFLIGHT_FAILED


def test_no_plan_is_a_usage_error_and_verify_ok():
    assert verdict("launch", None, None, False, 2, "bad input") == (
        Exit.USAGE, "invalid", "bad input")
    assert verdict("verify", None, gate(), True, 0, "m") == (
        Exit.OK, "verified", "every check passed")
    assert verdict("launch", None, gate(), True, 2, "sync broke") == (
        Exit.ERROR, "error", "sync broke")


def test_read_result_and_run_info_from_a_run_directory(tmp_path):
    run = tmp_path / "r1"
    (run / "artifacts" / "n0").mkdir(parents=True)
    (run / "artifacts" / "n0" / "model.pt").write_text("x")
    (run / "plan.json").write_text(json.dumps({
        "started_at": 5.0, "nproc_per_node": "auto", "job": {"rdzv": "static"},
        "nodes": [{"host": "n0", "node_rank": 0}, {"host": "n1", "node_rank": 1}]}))
    (run / "preflight.json").write_text(json.dumps(gate()))
    summ = summary("failed", "failed", "stopped", reason="n0 rank 1: RuntimeError")
    summ["timings"] = {"total": 3.5}
    (run / "summary.json").write_text(json.dumps(summ))
    result = read_result(run, "launch", 2, "m")
    assert result.exit_code == Exit.JOB_FAILED and result.reason == "n0 rank 1: RuntimeError"
    assert result.hosts["n0"]["artifacts"] == [str(run / "artifacts/n0/model.pt")]
    assert result.hosts["n1"]["artifacts"] == []
    assert result.static_nproc == 2  # 'auto' in the plan, resolved by the gate
    assert result.to_dict()["exit_name"] == "job_failed"
    info = run_info(run)
    assert (info.state, info.started_at, info.nodes) == ("failed", 5.0, ["n0", "n1"])
    assert run_info(tmp_path / "missing") is None
