"""Results of the nodes on the controller's clock: nodes whose clocks disagree still compare."""

import json

from ansible_collections.torchherd.cluster.plugins.filter.node_results import node_results
from ansible_collections.torchherd.cluster.plugins.plugin_utils._summary import summarize


def watched(ended_at, checked_at, received_at, state="failed"):
    return {"torchherd_node": {"node_rank": 0},
            "torchherd_watch": {"job_state": state, "exit_code": 1, "started_at": ended_at - 5,
                                "ended_at": ended_at, "checked_at": checked_at,
                                "received_at": received_at}}


def test_a_node_whose_clock_is_minutes_ahead_does_not_look_later():
    # The controller saw n0's answer at 1000.2 and n1's at 1000.4. n0's clock is right and its
    # job ended at 999.0; n1's clock is 300 s ahead and its job ended at 1299.5 on it
    # (999.5 on the controller's): n0 failed first.
    hostvars = {"n0": watched(999.0, 1000.2, 1000.2),
                "n1": watched(1299.5, 1300.4, 1000.4)}
    results = node_results(["n0", "n1"], hostvars)
    assert results["n1"]["clock_offset"] == 300.0 and results["n0"]["clock_offset"] == 0.0
    assert results["n1"]["ended_at"] == 999.5 and results["n1"]["started_at"] == 994.5
    plan = {"run_id": "r1", "nodes": [{"host": "n0", "node_rank": 0, "address": "a"},
                                      {"host": "n1", "node_rank": 1, "address": "b"}]}
    summary = summarize("/nonexistent", plan, results, {})
    assert summary["reason"].startswith("node n0 (node_rank 0)")
    # The same answers without the controller's time: the node's clock is all there is.
    hostvars["n1"]["torchherd_watch"].pop("received_at")
    assert node_results(["n1"], hostvars)["n1"]["ended_at"] == 1299.5


def test_a_node_the_masters_gang_lost_while_its_job_ran_is_unreachable():
    """The watch waited on the master alone; the gang lost n2 (its link closed without an
    exit), so the launch did not collect it: lost, not running."""
    master = watched(100.0, 100.0, 100.0, state="stopped")
    master["torchherd_watch"]["record"] = {"seq": 9, "gang": {"joined": 2, "expected": 2,
                                                             "lost": ["n2"],
                                                             "lost_at": {"n2": 95.0}}}
    started = {"torchherd_node": {"node_rank": 1},
               "torchherd_start": {"job_state": "running", "started_at": 90.0}}
    results = node_results(["n0", "n1", "n2"], {"n0": master, "n1": started, "n2": started})
    assert (results["n1"]["unreachable"], results["n2"]["unreachable"]) == (False, True)
    assert results["n2"]["error"].startswith("its link to the master's gang closed")
    assert results["n2"]["job_state"] == "running"  # summary makes it lost
    # When the master saw it go, on the controller's clock (the master's offset applied).
    assert results["n2"]["lost_at"] == round(95.0 - results["n0"]["clock_offset"], 3)
    assert results["n1"]["lost_at"] is None


def test_the_first_output_is_on_the_controllers_clock_and_timed_from_the_launch():
    """A node 300 s ahead said its first line at 1310.0 on its clock (1010.0 on the
    controller's); the driver began at 1000.0 and the plan at 1001.5."""
    node = watched(1320.0, 1320.4, 1020.4, state="succeeded")
    node["torchherd_watch"]["record"] = {"seq": 3, "job": {"first_output_at": 1310.0}}
    results = node_results(["n0"], {"n0": node})
    assert results["n0"]["first_output_at"] == 1010.0
    plan = {"run_id": "r1", "started_at": 1001.5, "launched_at": 1000.0,
            "nodes": [{"host": "n0", "node_rank": 0, "address": "a"}]}
    timings = summarize("/nonexistent", plan, results, {"preflight": 1004.0})["timings"]
    assert timings["launch"] == 1.5 and timings["preflight"] == 2.5
    # The plan's record written at 1002.0: the plan is a phase of its own, preflight after it.
    timings = summarize("/nonexistent", plan, results, {"plan": 1002.0, "preflight": 1004.0})[
        "timings"]
    assert timings["plan"] == 0.5 and timings["preflight"] == 2.0
    assert timings["first_output"] == 10.0 and timings["total"] > 10.0
    # ansible-playbook run by hand: no driver, the plan is where the launch began.
    plan.pop("launched_at")
    timings = summarize("/nonexistent", plan, results, {})["timings"]
    assert "launch" not in timings and timings["first_output"] == 8.5


def test_the_summary_says_how_long_after_the_jobs_end_it_came():
    """n1 (its clock 300 s ahead) ended last, at 999.5 on the controller's clock; a node still
    running gives no such time."""
    hostvars = {"n0": watched(999.0, 1000.2, 1000.2, state="succeeded"),
                "n1": watched(1299.5, 1300.4, 1000.4, state="succeeded")}
    plan = {"run_id": "r1", "started_at": 990.0,
            "nodes": [{"host": "n0", "node_rank": 0, "address": "a"},
                      {"host": "n1", "node_rank": 1, "address": "b"}]}
    timings = summarize("/nonexistent", plan, node_results(["n0", "n1"], hostvars), {})["timings"]
    # Both are taken from now: total from the plan (990.0), after_end from the end (999.5).
    assert abs(timings["after_end"] - (timings["total"] - 9.5)) < 0.01
    # A standby the job did not need ended later (at 1005.0): not the job's end.
    hostvars["n2"] = watched(1005.0, 1005.2, 1005.2, state="standby")
    plan["nodes"].append({"host": "n2", "node_rank": None, "address": "c"})
    with_standby = summarize("/nonexistent", plan, node_results(["n0", "n1", "n2"], hostvars),
                             {})["timings"]
    assert abs(with_standby["after_end"] - (with_standby["total"] - 9.5)) < 0.01
    hostvars.pop("n2")
    plan["nodes"].pop()
    hostvars["n1"]["torchherd_watch"].update(job_state="running", ended_at=None)
    timings = summarize("/nonexistent", plan, node_results(["n0", "n1"], hostvars), {})["timings"]
    assert "after_end" not in timings


def test_the_sync_and_the_start_end_where_the_last_node_record_says():
    """No play marks the sync's or the start's end: the node records do. The sync ends with the
    last node's copy (at preflight's end where every node had the code), the start with the
    last node's answer; a phase a node did not finish gets no end."""
    def node(rank, sync, start):
        # A node that had the code: the sync role ended there, and registered nothing.
        got = {"torchherd_sync": sync} if sync else {"torchherd_facts": {"code_current": True}}
        return {"torchherd_node": {"node_rank": rank}, "torchherd_start": start,
                "torchherd_gate": {"ok": True}, **got}

    hostvars = {
        "n0": node(0, None, {"started": True, "job_state": "running",
                             "checked_at": 13.0, "received_at": 13.5}),
        "n1": node(1, {"transferred_files": 1, "transferred_bytes": 9, "ended_at": 11.0},
                   {"started": True, "job_state": "running", "checked_at": 14.0,
                    "received_at": 14.0}),
    }
    plan = {"run_id": "r1", "started_at": 1.0,
            "nodes": [{"host": "n0", "node_rank": 0, "address": "a"},
                      {"host": "n1", "node_rank": 1, "address": "b"}]}
    results = node_results(["n0", "n1"], hostvars)
    assert results["n1"]["sync_ended_at"] == 11.0 and results["n0"]["sync_ended_at"] is None
    assert results["n0"]["start_answered_at"] == 13.5
    timings = summarize("/nonexistent", plan, results, {"plan": 2.0, "preflight": 10.0})["timings"]
    assert (timings["preflight"], timings["sync"], timings["start"]) == (8.0, 1.0, 3.0)

    # Every node had the code: the sync took no time.
    hostvars["n1"] = node(1, None, hostvars["n1"]["torchherd_start"])
    timings = summarize("/nonexistent", plan, node_results(["n0", "n1"], hostvars),
                        {"preflight": 10.0})["timings"]
    assert (timings["sync"], timings["start"]) == (0.0, 4.0)

    # The barrier called the start off on n1: no end of the start.
    hostvars["n1"]["torchherd_start"] = {"started": False, "job_state": "absent",
                                         "checked_at": 14.0, "received_at": 14.0}
    timings = summarize("/nonexistent", plan, node_results(["n0", "n1"], hostvars),
                        {"preflight": 10.0})["timings"]
    assert "sync" in timings and "start" not in timings

    # A sync that failed on n1 (the launch ended there): no end of the sync either.
    hostvars["n1"] = node(1, {"failed": True, "msg": "rsync push failed"}, None)
    timings = summarize("/nonexistent", plan, node_results(["n0", "n1"], hostvars),
                        {"preflight": 10.0})["timings"]
    assert "sync" not in timings and "start" not in timings


def test_the_summary_says_whether_the_launcher_started_ahead_ran_the_job():
    warm = watched(1320.0, 1320.4, 1320.4, state="succeeded")
    warm["torchherd_watch"]["record"] = {"seq": 4, "job": {
        "warm": {"used": True, "pid": 42, "waited": 0.4}}}
    anew = watched(1320.0, 1320.4, 1320.4, state="succeeded")
    anew["torchherd_watch"]["record"] = {"seq": 4, "job": {
        "warm": {"used": False, "why": "none waits for this run"}}}
    results = node_results(["n0", "n1", "n2"], {
        "n0": warm, "n1": anew, "n2": watched(1320.0, 1320.4, 1320.4, state="succeeded")})
    assert results["n0"]["warm"] == {"used": True, "pid": 42, "waited": 0.4}
    assert results["n1"]["warm"]["why"] == "none waits for this run"
    assert results["n2"]["warm"] is None
    plan = {"run_id": "r1", "nodes": [{"host": h, "node_rank": i, "address": "a"}
                                      for i, h in enumerate(["n0", "n1", "n2"])]}
    hosts = summarize("/nonexistent", plan, results, {})["hosts"]
    assert [hosts[h]["warm"] and hosts[h]["warm"]["used"] for h in ("n0", "n1", "n2")] == [
        True, False, None]


def test_the_launcher_started_aheads_times_are_on_the_controllers_clock():
    # The node's clock is 300 s ahead: its answer at 1620.4 came back at 1320.4.
    ahead = watched(1620.0, 1620.4, 1320.4, state="succeeded")
    ahead["torchherd_watch"]["record"] = {"seq": 4, "job": {"warm": {
        "used": True, "pid": 42, "waited": 0.0, "started_at": 1602.0, "ready_at": 1605.5,
        "asked_at": 1606.0}}}
    warm = node_results(["n0"], {"n0": ahead})["n0"]["warm"]
    assert (warm["started_at"], warm["ready_at"], warm["asked_at"]) == (1302.0, 1305.5, 1306.0)
    # The record itself keeps the node's times.
    assert ahead["torchherd_watch"]["record"]["job"]["warm"]["ready_at"] == 1605.5


def test_code_already_there_counts_as_synced_only_where_the_launch_came_to_the_sync():
    """A node whose code was current had nothing sent: zero files, once the gate let the launch
    go on. Where the gate stopped the launch, or the code differed, no sync came to it."""
    def node(current, gate_ok):
        return {"torchherd_node": {"node_rank": 0}, "torchherd_facts": {"code_current": current},
                "torchherd_gate": {"ok": gate_ok}}

    assert node_results(["n0"], {"n0": node(True, True)})["n0"]["sync"] == {"files": 0, "bytes": 0}
    assert node_results(["n0"], {"n0": node(True, False)})["n0"].get("sync") is None
    assert node_results(["n0"], {"n0": node(False, True)})["n0"].get("sync") is None
    sent = dict(node(False, True), torchherd_sync={"transferred_files": 2, "transferred_bytes": 5})
    assert node_results(["n0"], {"n0": sent})["n0"]["sync"] == {"files": 2, "bytes": 5}


def test_the_state_is_the_answer_that_read_the_node_last():
    """The stop's answer carries the newest copy of the node's record: its state wins over the
    watch's; a status that read the same record later (the node's clock) wins over both. A
    later phase that got no answer marks the node unreachable, whatever answered before."""
    node = watched(100.0, 100.0, 100.0)
    node["torchherd_watch"]["record"] = {"seq": 4}
    node["torchherd_stop"] = {"job_state": "stopped", "exit_code": -15, "checked_at": 90.0,
                              "record": {"seq": 5}}
    assert node_results(["n0"], {"n0": node})["n0"]["job_state"] == "stopped"
    node["torchherd_status"] = {"job_state": "stopped", "exit_code": -15, "checked_at": 120.0,
                                "last_line": "read later", "record": {"seq": 5}}
    assert node_results(["n0"], {"n0": node})["n0"]["last_line"] == "read later"
    node = watched(100.0, 100.0, 100.0, state="running")
    node["torchherd_stop"] = {"unreachable": True, "msg": "ssh: timed out\nmore"}
    result = node_results(["n0"], {"n0": node})["n0"]
    assert (result["job_state"], result["unreachable"], result["error"]) == (
        "running", True, "ssh: timed out")


def test_the_nodes_use_comes_from_the_newest_copy_of_its_record(tmp_path):
    """The wait's answer carries the recent samples and their stats; the record collect
    brought back (a later seq) keeps every point, and wins."""
    from ansible_collections.torchherd.cluster.plugins.module_utils._use import add, brief

    use = {"every": 1.0, "gpus": [0]}
    for i in range(5):
        use = add(use, [float(i), 1, 10.0 * i, 100.0, [[90.0, 1000.0 + i]]])
    node = watched(10.0, 10.0, 10.0, state="succeeded")
    early = brief(dict(use, points=use["points"][:2]))
    node["torchherd_watch"]["record"] = {"seq": 3, "use": early}
    answered = node_results(["n0"], {"n0": node})["n0"]["use"]
    assert answered["stats"]["samples"] == 2 and "points" not in answered
    (tmp_path / "n0").mkdir()
    (tmp_path / "n0" / "run.json").write_text(json.dumps({"seq": 4, "use": use}))
    kept = node_results(["n0"], {"n0": node}, nodes_dir=str(tmp_path))["n0"]["use"]
    assert kept["stats"]["samples"] == 5 and kept["stats"]["gpus"][0]["peak_memory_mib"] == 1004.0
    assert kept["recent"] == use["points"][-3:] and "points" not in kept
    # Nothing sampled: null.
    assert node_results(["n0"], {"n0": watched(10.0, 10.0, 10.0)})["n0"]["use"] is None
