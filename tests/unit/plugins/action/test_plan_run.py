"""plan_run: the plan phase in one task - the plan, the code's hash, the schedule, their checks
and the claim of the run id - with the records the launch's later phases and status, stop and
collect read."""

from __future__ import annotations

import json
import re
from pathlib import Path
from unittest import mock

import pytest
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.action.plan_run import ActionModule

GROUPS = {"torchherd_nodes": ["a", "b"]}
HOSTVARS = {"a": {"ansible_host": "10.0.0.1"}, "b": {"ansible_host": "10.0.0.2"}}


def _run(args, job, check_mode=False):
    task = mock.MagicMock(check_mode=check_mode)
    task.args = args
    plugin = ActionModule(task, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(),
                          mock.MagicMock(), mock.MagicMock())
    plugin._templar = mock.MagicMock(template=lambda value: value)
    task_vars = {"torchherd_job": job, "groups": GROUPS, "hostvars": HOSTVARS}
    with mock.patch.object(ActionBase, "run", return_value={}):
        return plugin.run(task_vars=task_vars)


@pytest.fixture
def code(tmp_path: Path) -> Path:
    src = tmp_path / "code"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    (src / "util.py").write_text("X = 1\n")
    return src


def test_the_plan_phase_in_one_task_writes_the_runs_records(tmp_path: Path, code: Path) -> None:
    runs = tmp_path / "runs"
    job = {"script": "train.py", "code_src": str(code), "runs_dir": str(runs),
           "nproc_per_node": 2}
    res = _run({"forks": 5, "launched_at": 100.0, "restart": 1}, job)
    plan, schedule, found = res["plan"], res["schedule"], res["code"]
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", plan["run_id"]), plan["run_id"]
    assert [n["host"] for n in plan["nodes"]] == ["a", "b"]
    assert (plan["launched_at"], plan["restart"]) == (100.0, 1)
    assert plan["job"]["runs_dir"] == str(runs) and plan["job"]["code_src"] == str(code)
    assert sorted(found["files"]) == ["train.py", "util.py"] and found["count"] == 2
    run_dir = runs / plan["run_id"]
    assert res["run_dir"] == str(run_dir)
    written = json.loads((run_dir / "plan.json").read_text())
    assert written == json.loads(json.dumps(dict(plan, code_hash=found["hash"], code_files=2)))
    assert json.loads((run_dir / "schedule.json").read_text())["forks"] == schedule["forks"] == 5
    marks = json.loads((run_dir / "marks.json").read_text())
    assert list(marks) == ["plan"] and marks["plan"] >= plan["started_at"]


def test_a_run_id_used_before_is_refused(tmp_path: Path, code: Path) -> None:
    job = {"script": "train.py", "code_src": str(code), "runs_dir": str(tmp_path / "runs"),
           "run_id": "mine"}
    _run({"forks": 5}, job)
    with pytest.raises(AnsibleActionFail, match=r"expected a new run id, found run mine"):
        _run({"forks": 5}, job)


def test_the_plans_checks_refuse_before_anything_is_written(tmp_path: Path, code: Path) -> None:
    runs = tmp_path / "runs"
    base = {"code_src": str(code), "runs_dir": str(runs)}
    with pytest.raises(AnsibleActionFail, match=r"job.script: expected missing.py inside "
                                                r"code_src .* found no such file"):
        _run({"forks": 5}, dict(base, script="missing.py"))
    with pytest.raises(AnsibleActionFail, match=r"code directory .*nowhere does not exist"):
        _run({"forks": 5}, dict(base, script="train.py", code_src=str(tmp_path / "nowhere")))
    # The job's own problems, in the plan filter's words.
    with pytest.raises(AnsibleActionFail, match=r"nproc_per_node"):
        _run({"forks": 5}, dict(base, script="train.py", nproc_per_node="many"))
    assert not runs.exists()


def test_check_mode_plans_and_writes_nothing(tmp_path: Path, code: Path) -> None:
    runs = tmp_path / "runs"
    res = _run({"forks": 5}, {"script": "train.py", "code_src": str(code),
                              "runs_dir": str(runs)}, check_mode=True)
    assert res["plan"]["nodes"] and res["files"][0].endswith("plan.json")
    assert not runs.exists()


def test_a_job_less_verify_hashes_nothing(tmp_path: Path) -> None:
    res = _run({"forks": 5, "playbook": "verify"}, {"runs_dir": str(tmp_path / "runs")})
    assert res["code"] == {}
    assert json.loads(Path(res["files"][0]).read_text())["code_hash"] is None


def test_a_relaunch_finds_the_last_launch_of_the_same_job_whose_preflight_passed(
        tmp_path: Path, code: Path) -> None:
    runs = tmp_path / "runs"
    job = {"script": "train.py", "code_src": str(code), "runs_dir": str(runs)}
    first = _run({"forks": 5}, job)
    assert first["prior"] is None and not first["schedule"]["start"]["with_facts"]
    pointers = list((runs / ".relaunch").iterdir())
    assert [json.loads(p.read_text()) for p in pointers] == [{"run_id": first["plan"]["run_id"]}]
    # No preflight.json (the launch ended before its verdict): the full path again.
    second = _run({"forks": 5}, job)
    assert second["prior"] is None
    facts = {"euid": 0, "hostname": "x"}
    (runs / second["plan"]["run_id"] / "preflight.json").write_text(json.dumps({
        "gate": {"ok": True, "backend": "gloo", "interfaces": {}, "master_port": 29500,
                 "node_env": {}, "nproc_per_node": 1, "nprocs": {"a": 1, "b": 1}},
        "facts": {"a": facts, "b": facts}}))
    third = _run({"forks": 5}, job)
    assert third["schedule"]["start"]["with_facts"]
    assert third["prior"]["run_id"] == second["plan"]["run_id"]
    assert set(third["prior"]["expect"]) == {"a", "b"}
    # Fewer forks than nodes: the barrier is not in the start's call, no prior handed on.
    assert _run({"forks": 1}, job)["prior"] is None
    # Check mode neither follows nor leaves a pointer; verify leaves none.
    before = [p.read_text() for p in (runs / ".relaunch").iterdir()]
    assert _run({"forks": 5}, job, check_mode=True)["prior"] is None
    _run({"forks": 5, "playbook": "verify"}, job)
    assert [p.read_text() for p in (runs / ".relaunch").iterdir()] == before
