"""run_record's mark: each phase's end goes into the run directory's marks.json, the marks
there before kept; run_summary takes the timings from there, so that a later status, stop or
collect (which record no marks) keeps the launch's."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

from ansible.plugins.action import ActionBase

from ansible_collections.torchherd.cluster.plugins.action.run_record import (
    ActionModule as RunRecord,
)
from ansible_collections.torchherd.cluster.plugins.action.run_summary import (
    ActionModule as RunSummary,
)


def _run(action, args):
    task = mock.MagicMock(check_mode=False)
    task.args = args
    plugin = action(task, mock.MagicMock(), mock.MagicMock(), mock.MagicMock(),
                    mock.MagicMock(), mock.MagicMock())
    with mock.patch.object(ActionBase, "run", return_value={}):
        return plugin.run(task_vars={})


def test_each_mark_is_added_to_the_runs_marks(tmp_path: Path) -> None:
    run_dir = tmp_path / "r1"
    first = _run(RunRecord, {"run_dir": str(run_dir), "mark": "plan",
                             "files": {"plan.json": "{}"}})
    second = _run(RunRecord, {"run_dir": str(run_dir), "mark": "preflight"})
    marks = json.loads((run_dir / "marks.json").read_text())
    assert marks == {"plan": first["written_at"], "preflight": second["written_at"]}
    assert second["files"] == [str(run_dir / "marks.json")]
    # No mark, no change to them.
    _run(RunRecord, {"run_dir": str(run_dir), "files": {"schedule.json": "{}"}})
    assert json.loads((run_dir / "marks.json").read_text()) == marks


def test_the_summary_takes_the_recorded_marks_and_the_tasks_over_them(tmp_path: Path) -> None:
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    (run_dir / "marks.json").write_text(json.dumps({"plan": 101.0, "preflight": 103.0}))
    plan = {"run_id": "r1", "started_at": 100.0, "job": {"name": "j"}, "nodes": [],
            "master": {"host": "n0"}}
    with mock.patch("ansible_collections.torchherd.cluster.plugins.action.run_summary"
                    ".write_summary", return_value=({}, "", "")) as write:
        _run(RunSummary, {"run_dir": str(run_dir), "plan": plan, "results": {},
                          "marks": {"preflight": 104.0}})
    assert write.call_args.args[3] == {"plan": 101.0, "preflight": 104.0}


def test_the_summary_records_the_phase_that_ends_as_it_begins(tmp_path: Path) -> None:
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    (run_dir / "marks.json").write_text(json.dumps({"plan": 101.0, "watch": 108.0}))
    plan = {"run_id": "r1", "started_at": 100.0, "job": {"name": "j"}, "nodes": [],
            "master": {"host": "n0"}}
    with mock.patch("ansible_collections.torchherd.cluster.plugins.action.run_summary"
                    ".write_summary", return_value=({}, "", "")) as write:
        _run(RunSummary, {"run_dir": str(run_dir), "plan": plan, "results": {},
                          "mark": "collect"})
    marks = json.loads((run_dir / "marks.json").read_text())
    assert set(marks) == {"plan", "watch", "collect"} and marks["collect"] > 108.0
    assert write.call_args.args[3] == marks


def test_a_collects_copies_mark_the_watchs_end_once(tmp_path: Path) -> None:
    """The first node's copy records the phase that ended as the collect began; the later
    nodes' copies keep its time, and a copy without a mark (a later collect) writes none."""
    from ansible_collections.torchherd.cluster.plugins.action.rsync import ActionModule as Rsync

    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    (run_dir / "marks.json").write_text(json.dumps({"plan": 101.0, "start": 103.0}))
    src = tmp_path / "node-run"
    src.mkdir()
    (src / "node.log").write_text("done\n")

    def pull(node: str, mark: dict | None) -> dict:
        args = {"direction": "pull", "src": str(src), "dest": str(run_dir / "nodes" / node)}
        task = mock.MagicMock(check_mode=False)
        task.args = {**args, **({"mark": mark} if mark else {})}
        plugin = Rsync(task, mock.MagicMock(transport="local"), mock.MagicMock(),
                       mock.MagicMock(), mock.MagicMock(), mock.MagicMock())
        with mock.patch.object(ActionBase, "run", return_value={}):
            return plugin.run(task_vars={})

    mark = {"run_dir": str(run_dir), "phase": "watch"}
    assert not pull("n0", mark).get("failed")
    first = json.loads((run_dir / "marks.json").read_text())
    assert set(first) == {"plan", "start", "watch"} and first["watch"] > 103.0
    assert not pull("n1", mark).get("failed")
    assert not pull("n1", None).get("failed")
    assert json.loads((run_dir / "marks.json").read_text()) == first
    assert (run_dir / "nodes" / "n1" / "node.log").read_text() == "done\n"
