"""runs --prune: the keep policy, durations, why a run stays, and a controller-only prune of
real run directories (no node is asked: nothing of Ansible runs here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest

from ansible_collections.torchherd.cluster.plugins.modules.prune_runs import (
    size_of as node_size_of,
)
from driver import api
from driver.cli import main
from driver.prune import (
    BUSY_SECONDS,
    busy_hold,
    controller_only_hold,
    elsewhere_hold,
    nodes_hold,
    parse_duration,
    select,
    size_of,
    verdict,
)
from driver.result import Exit, RunInfo, UsageError

SCHEMA = json.loads((Path(api.__file__).parent / "schema.json").read_text())
NOW = 1_800_000_000.0
DAY = 86400.0


def info(run_id: str, started_at: float | None, state: str = "succeeded",
         run_dir: Path | None = None) -> RunInfo:
    return RunInfo(run_id, run_dir or Path("/nowhere") / run_id, state, started_at, ["a"], "")


@pytest.mark.parametrize(("text", "seconds"), [
    ("7d", 7 * DAY), ("12h", 12 * 3600), ("30m", 1800), ("90s", 90), ("2w", 14 * DAY),
    ("1d12h", 1.5 * DAY), ("0.5h", 1800), (" 3D ", 3 * DAY),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "d", "7x", "-1d", "7d junk", "1d 2h", "1.d"])
def test_a_bad_duration_names_what_was_typed(text):
    with pytest.raises(UsageError, match=f"--older-than {text!r}: expected a duration"):
        parse_duration(text)


def test_keep_lets_the_oldest_go_whatever_order_they_come_in():
    runs = [info("c", NOW - 1 * DAY), info("a", NOW - 3 * DAY), info("b", NOW - 2 * DAY)]
    assert [r.run_id for r in select(runs, 1, None, NOW)] == ["a", "b"]
    assert [r.run_id for r in select(runs, 3, None, NOW)] == []
    assert [r.run_id for r in select(runs, 0, None, NOW)] == ["a", "b", "c"]


def test_older_than_keeps_recent_runs_and_those_of_unknown_age():
    runs = [info("old", NOW - 10 * DAY), info("new", NOW - DAY), info("ageless", None)]
    assert [r.run_id for r in select(runs, None, 7 * DAY, NOW)] == ["old"]


def test_with_both_a_run_goes_only_where_both_let_it():
    runs = [info(f"r{i}", NOW - i * DAY) for i in range(1, 6)]  # r5 oldest
    # keep 3 lets r5 and r4 go; older than 4.5 days only r5.
    assert [r.run_id for r in select(runs, 3, 4.5 * DAY, NOW)] == ["r5"]
    # older than 1.5 days lets r2..r5 go; keep 3 holds r1..r3.
    assert [r.run_id for r in select(runs, 3, 1.5 * DAY, NOW)] == ["r5", "r4"]


def test_a_policy_is_required_and_keep_is_not_negative():
    with pytest.raises(UsageError, match="expected a keep policy"):
        select([], None, None, NOW)
    with pytest.raises(UsageError, match="--keep -1"):
        select([], -1, None, NOW)


def test_without_nodes_a_run_that_may_still_run_stays():
    assert controller_only_hold(info("a", NOW, "succeeded")) is None
    assert controller_only_hold(info("a", NOW, "failed")) is None
    for state in ("running", "unknown"):
        code, why = controller_only_hold(info("a", NOW, state))
        assert code == Exit.OK and "-i INVENTORY" in why


def test_a_run_of_another_inventory_stays_and_says_which_inventory_prunes_it():
    assert elsewhere_hold(["a", "b"], {"a", "b", "c"}, "x.ini") is None
    code, why = elsewhere_hold(["a", "z"], {"a", "b"}, "/p/other.ini")
    assert code == Exit.OK  # not an error: this inventory cannot reach it
    assert why == "its nodes z are not in this inventory: prune it with -i /p/other.ini"
    assert elsewhere_hold(["z"], set(), None)[1].endswith("with the inventory it ran on")


def test_the_nodes_decide_a_run_stays_while_any_runs_it_or_is_silent():
    ended = {"state": "succeeded", "removed": True, "bytes": 10}
    assert nodes_hold(["a", "b"], {"a": ended, "b": {"state": "missing", "removed": False}}) \
        is None
    assert nodes_hold(["a", "b"], {"a": ended, "b": {"state": "running"}}) == \
        (Exit.OK, "its job runs on b")
    code, why = nodes_hold(["a", "b"], {"a": ended, "b": {"no_answer": "unreachable: timeout"}})
    assert code == Exit.NODE_UNREACHABLE and "b (unreachable: timeout)" in why
    code, why = nodes_hold(["a", "b"], {"a": ended})
    assert code == Exit.NODE_UNREACHABLE and "b (no answer)" in why
    code, why = nodes_hold(["a"], {"a": dict(ended, removed=False, error="Permission denied")})
    assert code == Exit.ERROR and "a (Permission denied)" in why


def test_a_run_without_summary_written_to_a_moment_ago_stays(tmp_path):
    run = info("r", NOW, "unknown", tmp_path)
    (tmp_path / "plan.json").write_text("{}")
    written = (tmp_path / "plan.json").stat().st_mtime
    assert busy_hold(run, written + 5)[1].startswith("written to 5 s ago")
    assert busy_hold(run, written + BUSY_SECONDS + 1) is None
    assert busy_hold(info("r", NOW, "succeeded", tmp_path), written + 5) is None


def test_the_verdict_puts_a_silent_node_first():
    assert verdict([(Exit.OK, "its job runs on a")]) == (Exit.OK, "")
    code, reason = verdict([(Exit.ERROR, "not removed on a"), (Exit.NODE_UNREACHABLE, "x"),
                            (Exit.NODE_UNREACHABLE, "y")])
    assert code == Exit.NODE_UNREACHABLE and reason == "kept 2 run(s): x (and 1 more)"


def make_run(runs_dir: Path, run_id: str, started_at: float, state: str | None) -> Path:
    run_dir = runs_dir / run_id
    (run_dir / "nodes" / "a").mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps(
        {"run_id": run_id, "started_at": started_at, "nodes": [{"host": "a", "root": "/r"}]}))
    (run_dir / "nodes" / "a" / "node.log").write_bytes(b"x" * 1000)
    if state:
        (run_dir / "summary.json").write_text(json.dumps({"state": state, "hosts": {}}))
    old = started_at + 60
    for path in [run_dir, *run_dir.iterdir()]:
        os.utime(path, (old, old))
    return run_dir


def test_a_controller_only_prune_removes_only_with_yes(tmp_path, capsys):
    runs_dir = tmp_path / "runs"
    for i, state in enumerate(["succeeded", "running", "failed", "succeeded"]):
        make_run(runs_dir, f"r{i}", NOW - (10 - i) * DAY, state)
    argv = ["runs", "--prune", "--keep", "1", "--runs-dir", str(runs_dir), "--json"]
    assert main(argv) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["dry_run"] and not doc["nodes_asked"]
    assert [(r["run_id"], r["removed"]) for r in doc["runs"]] == \
        [("r0", True), ("r1", False), ("r2", True)]
    assert doc["totals"]["runs"] == 2 and doc["totals"]["bytes"] > 2000
    assert sorted(p.name for p in runs_dir.iterdir()) == ["r0", "r1", "r2", "r3"]

    assert main([*argv, "--yes"]) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    assert not doc["dry_run"]
    assert "running" in doc["runs"][1]["kept"]
    assert sorted(p.name for p in runs_dir.iterdir()) == ["r1", "r3"]


def test_prune_flags_without_prune_are_a_usage_error(tmp_path, capsys):
    assert main(["runs", "--keep", "3", "--runs-dir", str(tmp_path), "--json"]) == Exit.USAGE
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert "--keep" in doc["reason"]


def test_the_controller_counts_a_run_directory_as_the_nodes_do(tmp_path):
    """The driver imports nothing of the collection, so driver.prune.size_of is a copy of the
    prune_runs module's: the two must give the same (bytes, files) for the same tree."""
    top = tmp_path / "run"
    (top / "nodes" / "n0").mkdir(parents=True)
    (top / "empty").mkdir()
    (top / "plan.json").write_text("{}")
    (top / "nodes" / "n0" / "node.log").write_bytes(b"x" * 5000)
    # Links count as themselves: never followed, a directory's never walked into.
    (top / "to-log").symlink_to(top / "nodes" / "n0" / "node.log")
    (top / "dangling").symlink_to(tmp_path / "nowhere")
    (top / "to-dir").symlink_to(top / "nodes")
    for tree in (top, top / "empty", tmp_path / "missing"):
        assert size_of(tree) == node_size_of(str(tree)), tree
    total, files = size_of(top)
    assert files == 4 and 5002 < total < 5002 + 2 * len(str(tmp_path)) + 100
