"""Exit codes and states from summary.json / preflight.json (driver.result.verdict)."""

import json
from pathlib import Path

import jsonschema
import pytest

from driver.result import DRIVER_FILE, Exit, read_result, run_info, verdict


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


# What node_facts returned on an H100 node (tests/unit/plugins/filter/test_gate_recorded_gpu.py).
H100 = json.loads((Path(__file__).resolve().parent / "plugins" / "filter" / "fixtures"
                   / "h100_node_facts.json").read_text(encoding="utf-8"))
PLAN = {"master": {"host": "gpu0", "addr": "10.0.0.1", "port": 29500},
        "nodes": [{"host": "gpu0", "node_rank": 0}, {"host": "gpu1", "node_rank": 1},
                  {"host": "gpu2", "node_rank": 2}]}


def verify_dir(tmp_path, *problems, facts=("gpu0", "gpu1")):
    run = tmp_path / "r-verify"
    run.mkdir()
    (run / "plan.json").write_text(json.dumps(PLAN))
    preflight = gate(*problems)
    preflight["gate"].update(interfaces={"gpu0": {"name": "ib0", "address": "10.0.0.1",
                                                  "how": "local"}}, nprocs={"gpu0": 1})
    preflight["facts"] = {host: H100 for host in facts}
    (run / "preflight.json").write_text(json.dumps(preflight))
    return run


def test_verify_names_the_nics_nearest_to_each_gpu(tmp_path):
    run = verify_dir(tmp_path)
    preflight = json.loads((run / "preflight.json").read_text())
    uuid = H100["torch"]["gpus"][0]["uuid"]
    preflight["facts"]["gpu0"] = dict(H100, gpu_nics={
        uuid.removeprefix("GPU-"): {"mlx5_0": "PXB", "mlx5_1": "PXB", "mlx5_4": "SYS"}})
    (run / "preflight.json").write_text(json.dumps(preflight))
    hosts = read_result(run, "verify", 0, "").hosts
    assert (hosts["gpu0"]["gpus"][0]["nics"], hosts["gpu0"]["gpus"][0]["link"]) == (
        ["mlx5_0", "mlx5_1"], "PXB")
    assert hosts["gpu1"]["gpus"][0]["nics"] == []


def test_verify_shows_every_node_as_preflight_found_it(tmp_path):
    run = verify_dir(tmp_path, ("gpu1, gpu0", "torch"), ("gpu2", "ssh"))
    result = read_result(run, "verify", 2, "")
    assert list(result.hosts) == ["gpu0", "gpu1", "gpu2"]
    gpu0 = result.hosts["gpu0"]
    assert (gpu0["node_rank"], gpu0["role"], gpu0["check"], gpu0["failed_checks"]) == (
        0, "master", "failed", ["torch"])
    assert (gpu0["python"], gpu0["torch"], gpu0["cuda"], gpu0["nccl"]) == (
        "3.12.3", "2.11.0+cu130", "13.0", "2.28.9")
    assert gpu0["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85017493504,
                             "nics": [], "link": None}]
    assert gpu0["interface"] == {"name": "ib0", "address": "10.0.0.1", "how": "local"}
    assert (gpu0["nproc_per_node"], gpu0["disk_free_bytes"]) == (1, 68660191232)
    # No interface in the gate: the node's own choice; the launchers it lacks, none.
    assert result.hosts["gpu1"]["interface"] is None and result.hosts["gpu1"]["role"] == "worker"
    assert result.hosts["gpu2"]["check"] == "unreachable"
    assert result.hosts["gpu2"]["torch"] is None and result.hosts["gpu2"]["gpus"] == []
    # The --json document holds them, as driver/schema.json says.
    schema = json.loads((Path(__file__).resolve().parents[2] / "driver" / "schema.json")
                        .read_text(encoding="utf-8"))
    document = json.loads(json.dumps(result.to_dict()))
    jsonschema.validate(document, schema)
    document["hosts"]["gpu0"]["check"] = "fine"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, schema)


def test_verify_that_passed_and_one_that_never_gathered(tmp_path):
    run = verify_dir(tmp_path)
    result = read_result(run, "verify", 0, "")
    assert [h["check"] for h in result.hosts.values()] == ["passed", "passed", "unchecked"]
    assert result.reason == "every check passed"
    # A launch's hosts stay summary.json's: none before it is written.
    assert read_result(run, "launch", 2, "boom").hosts == {}


def test_preflights_warnings_pass_verify_and_are_in_the_json(tmp_path):
    run = verify_dir(tmp_path)
    preflight = json.loads((run / "preflight.json").read_text())
    warning = {"host": "gpu0", "check": "shm", "expected": ">= 1.0 GiB of /dev/shm for 2 "
               "processes", "found": "62 MiB", "fix": "--shm-size=8g"}
    preflight["gate"]["warnings"] = [warning]
    (run / "preflight.json").write_text(json.dumps(preflight))
    result = read_result(run, "verify", 0, "")
    assert result.exit_code == Exit.OK and result.warnings == [warning]
    assert result.hosts["gpu0"]["check"] == "passed"  # a warning fails no node
    schema = json.loads((Path(__file__).resolve().parents[2] / "driver" / "schema.json")
                        .read_text(encoding="utf-8"))
    document = json.loads(json.dumps(result.to_dict()))
    jsonschema.validate(document, schema)
    assert document["warnings"] == [warning]


def test_runs_lists_a_passed_verify_by_the_drivers_note_not_as_unknown(tmp_path):
    """A verify writes no summary.json: without the driver's note it would look like a launch
    still in progress (unknown), which runs --prune keeps."""
    run = verify_dir(tmp_path)
    assert run_info(run).state == "unknown"
    (run / DRIVER_FILE).write_text(json.dumps(
        {"verify": {"state": "verified", "reason": "every check passed"}}))
    assert (run_info(run).state, run_info(run).reason) == ("verified", "every check passed")


def test_runs_lists_a_launch_that_ended_before_its_summary_by_the_drivers_note(tmp_path):
    run = verify_dir(tmp_path)
    (run / DRIVER_FILE).write_text(json.dumps(
        {"launch": {"state": "error", "reason": "node0: an Ansible error"}}))
    assert (run_info(run).state, run_info(run).reason) == ("error", "node0: an Ansible error")


def test_a_master_port_of_auto_is_the_port_the_master_picked(tmp_path):
    """plan.json keeps the job's auto; the result (verify's, which has no summary, as a
    launch's) says the port preflight picked, as summary.json does."""
    run = verify_dir(tmp_path)
    plan = dict(PLAN, master={"host": "gpu0", "addr": "10.0.0.1", "port": "auto"})
    (run / "plan.json").write_text(json.dumps(plan))
    preflight = json.loads((run / "preflight.json").read_text())
    preflight["gate"]["master_port"] = 41873
    (run / "preflight.json").write_text(json.dumps(preflight))
    assert read_result(run, "verify", 0, "").master == {"host": "gpu0", "addr": "10.0.0.1",
                                                        "port": 41873}
