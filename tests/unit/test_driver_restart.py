"""The driver's whole-job restarts: when to restart, and the record of each incident."""

import json

from driver import restart as restarts


def schedule(this=0, left=2, on=("node_lost", "signal", "connection")):
    return {"restart": {"this": this, "left": left, "on": list(on), "excluded": {}}}


JOB = schedule()


def summary(kind="node_lost", state="failed", cause="n1", **hosts):
    return {"state": state, "cause": cause, "cause_kind": kind, "reason": f"{cause} {kind}",
            "written_at": 100.0,
            "hosts": hosts or {"n0": {"node_rank": 0, "ended_at": 90.0, "first_output_at": 5.0},
                               "n1": {"node_rank": 1, "ended_at": None}}}


def test_a_lost_node_restarts_and_is_named():
    inc = restarts.incident(summary(), JOB)
    assert inc["restart"] == 1 and inc["kind"] == "node_lost" and inc["node"] == "n1"
    assert inc["node_rank"] == 1 and inc["at"] == 100.0  # no end, no loss seen: the summary's
    # Where the master's gang saw the link close, that moment.
    seen = summary(n0={"node_rank": 0, "ended_at": 90.0},
                   n1={"node_rank": 1, "ended_at": None, "lost_at": 80.5})
    assert restarts.incident(seen, JOB)["at"] == 80.5


def test_no_restart_once_spent_or_for_other_kinds_or_states():
    assert restarts.incident(summary(), schedule(this=2, left=0, on=())) is None
    assert restarts.incident(summary(kind="exception"), JOB) is None
    assert restarts.incident(summary(state="succeeded"), JOB) is None
    assert restarts.incident(summary(), {}) is None  # a schedule without restarts
    assert restarts.incident(summary(), schedule(this=1, left=1))["restart"] == 2


def test_an_exception_restarts_on_request_without_leaving_a_node_out():
    inc = restarts.incident(summary(kind="exception"), schedule(on=["exception"]))
    assert inc["node"] is None and inc["kind"] == "exception"


def test_settle_names_the_replacement_and_the_time_to_first_output():
    inc = restarts.incident(summary(), JOB)
    incidents = [inc]
    after = {"hosts": {"n0": {"node_rank": 0, "first_output_at": 130.0},
                       "n3": {"node_rank": 1, "first_output_at": 125.5}}}
    restarts.settle(incidents, after)
    assert inc["replaced_by"] == "n3" and inc["first_output_after"] == 25.5


def test_keep_attempt_moves_all_but_the_driver_note(tmp_path):
    for name in ("plan.json", "summary.json", "driver.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "nodes" / "n0").mkdir(parents=True)
    kept = restarts.keep_attempt(tmp_path, 1)
    assert kept == tmp_path / "restarts" / "0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["driver.json", "restarts"]
    assert (kept / "plan.json").exists() and (kept / "nodes" / "n0").is_dir()
    (tmp_path / "plan.json").write_text("{}")
    restarts.keep_attempt(tmp_path, 2)
    assert sorted(p.name for p in (tmp_path / "restarts").iterdir()) == ["0", "1"]


def test_record_adds_the_incidents_to_the_summary(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"state": "succeeded"}))
    restarts.record(tmp_path, [{"restart": 1}])
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "state": "succeeded", "incidents": [{"restart": 1}]}


def test_a_restart_that_could_not_start_gives_the_run_back_its_records(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "driver.json").write_text("{}")
    restarts.keep_attempt(tmp_path, 1)
    assert not (tmp_path / "summary.json").exists()
    restarts.restore_attempt(tmp_path, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["driver.json", "summary.json"]
