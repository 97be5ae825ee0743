"""ansible-runner events -> the per-node progress table (driver.progress)."""

from rich.console import Console

from driver.progress import Progress, phase_of


def ev(kind, host="", task="", play="", role="", res=None, **data):
    return {"event": kind, "event_data": {"host": host, "task": task, "play": play,
                                          "role": role, "res": res or {}, **data}}


BIG = "Preflight, sync, firewall and start"


def test_phases_from_plays_and_roles():
    assert phase_of("Plan", "plan", "") == "plan"
    assert phase_of(BIG, "preflight", "plan") == "preflight"
    assert phase_of(BIG, "sync", "preflight") == "sync"
    assert phase_of(BIG, "torchrun", "sync") == "start"
    assert phase_of(BIG, "", "sync") == "sync"  # a phase mark keeps the phase
    assert phase_of("Watch", "torchrun", "start") == "watch"
    assert phase_of("Stop", "torchrun", "plan") == "stop"
    assert phase_of("Summary", "collect", "collect") == "summary"


def launch_events():
    secret_plan = {"torchherd_plan": {"job": {"rdzv": "static", "secret_env": {"K": "s3cret"}},
                                      "nproc_per_node": 2}}
    yield ev("playbook_on_play_start", play="Plan")
    yield ev("runner_on_ok", "localhost", "Compute the plan", "Plan", "plan",
             {"ansible_facts": secret_plan})
    for i, host in enumerate(("n0", "n1")):
        yield ev("runner_item_on_ok", "localhost", "Put the nodes in rank order", "Plan", "plan",
                 {"add_host": {"host_name": host, "host_vars": {"torchherd_node_rank": i}}})
    yield ev("playbook_on_task_start", task="Gather node facts", play=BIG, role="preflight")
    yield ev("runner_on_ok", "n0", "Gather node facts", BIG, "preflight", {"hostname": "n0"})
    yield ev("runner_on_ok", "n1", "Gather node facts", BIG, "preflight", {"hostname": "n1"})
    yield ev("playbook_on_task_start", task="Start torchrun on every node", play=BIG,
             role="torchrun")
    for i, host in enumerate(("n0", "n1")):
        yield ev("runner_on_ok", host, "Start torchrun on every node", BIG, "torchrun",
                 {"job_state": "running", "last_line": "", "meta": {"node_rank": i}})
    yield ev("playbook_on_play_start", play="Watch")
    yield ev("runner_retry", "n1", "Wait for the job", "Watch", "torchrun",
             {"job_state": "running", "last_line": "[default1]:step 7"})
    yield ev("runner_on_failed", "n1", "Wait for the job", "Watch", "torchrun",
             {"job_state": "failed", "last_line": "[default1]:boom"})


def test_events_fold_into_rows_and_plain_lines():
    progress = Progress("torchherd launch r1")
    lines = [line for event in launch_events() for line in progress.update(event)]
    assert progress.rows["n0"].rank == "0" and progress.rows["n1"].rank == "1"
    assert progress.rows["n0"].state == "running" and progress.rows["n0"].phase == "start"
    row = progress.rows["n1"]
    assert (row.phase, row.state, row.note) == ("watch", "failed", "r3: boom")
    assert lines[:2] == ["torchherd: plan", "torchherd: preflight"]
    assert "torchherd: n1 (node_rank 1): failed: r3: boom" in lines
    # A retry that changes nothing prints nothing: no line per watch round.
    assert not any("step 7" in line for line in lines)
    assert not any("s3cret" in line for line in lines)


def test_unreachable_and_gate_problems():
    progress = Progress()
    progress.update(ev("runner_item_on_ok", "localhost", "x", "Plan", "plan",
                       {"add_host": {"host_name": "n0", "host_vars": {"torchherd_node_rank": 0}}}))
    progress.update(ev("runner_item_on_ok", "localhost", "x", "Plan", "plan",
                       {"add_host": {"host_name": "n1", "host_vars": {"torchherd_node_rank": 1}}}))
    assert progress.update(ev("runner_on_unreachable", "n1", "Gather node facts", BIG,
                              "preflight", {"msg": "ssh: connect refused\nmore"})) == [
        "torchherd: n1 (node_rank 1): unreachable: ssh: connect refused"]
    gate = {"ok": False, "nproc_per_node": 2,
            "problems": [{"host": "n0", "check": "gpus", "expected": ">= 2", "found": "0"}]}
    progress.update(ev("runner_on_ok", "n0", "Compare the nodes", BIG, "preflight",
                       {"ansible_facts": {"torchherd_gate": gate}}))
    assert progress.rows["n0"].state == "preflight failed"
    assert progress.rows["n0"].note == "gpus: found 0"
    # The play's fail task is the gate's verdict, not a failure of the host it ran on.
    assert progress.update(ev("runner_on_failed", "n0", "Stop before anything starts", BIG,
                              "preflight", {"msg": "preflight failed"})) == []


def test_summary_sets_final_states_and_the_table_renders():
    progress = Progress("t")
    summary = {"nproc_per_node": 2, "hosts": {
        "n0": {"node_rank": 0, "state": "succeeded", "last_line": "[default1]:done"},
        "n1": {"node_rank": 1, "state": "failed", "exception": "RuntimeError: x"}}}
    lines = progress.update(ev("runner_on_ok", "localhost", "Write summary.json", "Summary",
                               "collect", {"summary": summary}))
    assert lines == ["torchherd: n0 (node_rank 0): succeeded: r1: done",
                     "torchherd: n1 (node_rank 1): failed: RuntimeError: x"]
    console = Console(width=120, record=True)
    console.print(progress.table())
    text = console.export_text()
    assert "n1" in text and "RuntimeError: x" in text and "succeeded" in text
