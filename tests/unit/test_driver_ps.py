"""ps on the controller: the nodes' answers read from ansible-runner's events (a node that did
not answer named with why), a run seen by several nodes of one machine shown once, the exit
code, the table and the --json document."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from driver import ps as ps_module
from driver.cli import main
from driver.ps import NodeUse, PsReport, answer, ps, shared_machines, verdict
from driver.result import Exit
from driver.runner import Outcome
from driver.ui import console, ps_table

SCHEMA = json.loads((Path(ps_module.__file__).parent / "schema.json").read_text())


def a_run(run_id: str, host: str, rank: int, **extra: Any) -> dict[str, Any]:
    return {"run_id": run_id, "run_dir": f"/root/.torchherd/runs/{run_id}", "name": "allreduce",
            "host": host, "node_rank": rank, "user": "root", "started_at": 1795860900.5,
            "state": "running", "job_state": "running", "exit_code": None, "pids": [42, 43],
            "gpus": [0, 1], "gpu_memory_bytes": 2 * 1024 ** 3, **extra}


def event(kind: str, host: str, res: dict[str, Any]) -> dict[str, Any]:
    return {"event": kind, "event_data": {"host": host, "resolved_action": ps_module.PS_MODULE,
                                          "task_action": "torchherd.cluster.node_runs",
                                          "res": res}}


# What ansible-core 2.19 says of a node whose sshd is down, and of one without the interpreter.
UNREACHABLE = {"msg": "Task failed: Failed to connect to the host via ssh: ssh: connect to host "
                      "10.0.0.9 port 22: Connection refused", "unreachable": True}
NO_PYTHON = {"msg": "The module failed to execute correctly, you probably need to set the "
                    "interpreter.\nSee stdout/stderr for the exact error",
             "module_stderr": "/bin/sh: 1: /usr/bin/python3: not found\n", "rc": 127}


def test_each_answer_or_why_there_is_none():
    node = NodeUse("n0")
    answer(node, "runner_on_ok", {"runs": [a_run("r1", "n0", 0)], "gpu_processes": [],
                                  "sees_all": True})
    assert (len(node.runs), node.gpu_processes, node.no_answer) == (1, [], None)
    down = NodeUse("n9")
    answer(down, "runner_on_unreachable", UNREACHABLE)
    assert down.no_answer.startswith("unreachable: Failed to connect to the host via ssh")
    bare = NodeUse("n8")
    answer(bare, "runner_on_failed", NO_PYTHON)
    assert bare.no_answer == "no python: /bin/sh: 1: /usr/bin/python3: not found"
    answer(bare, "runner_on_failed", {"msg": "reading the node's runs: boom"})
    assert bare.no_answer == "failed: reading the node's runs: boom"


def test_a_run_that_nodes_of_one_machine_all_see_is_its_own_nodes():
    # Two local nodes on one machine: each sees both runs' processes.
    both = [a_run("r1", "node0", 0), a_run("r1", "node1", 1, run_dir="/b/runs/r1"),
            a_run("other", "elsewhere", 3)]
    nodes = {"node0": NodeUse("node0", runs=list(both)), "node1": NodeUse("node1", runs=list(both))}
    shared_machines(nodes)
    assert [(r["run_id"], r["node_rank"]) for r in nodes["node0"].runs] == [("r1", 0),
                                                                            ("other", 3)]
    assert [(r["run_id"], r["node_rank"]) for r in nodes["node1"].runs] == [("r1", 1),
                                                                            ("other", 3)]


def test_a_silent_node_is_node_unreachable_as_in_status():
    assert verdict({"n0": NodeUse("n0")}) == (Exit.OK, "")
    code, reason = verdict({"n0": NodeUse("n0"), "n9": NodeUse("n9", no_answer="unreachable: x")})
    assert code == Exit.NODE_UNREACHABLE and reason == "no answer from n9 (unreachable: x)"


def fake_playbook(events: list[dict[str, Any]], rc: int = 0) -> Any:
    def run(name, inventory, extravars, on_event=None, cancelled=None, verbosity=0):
        assert name == "ps" and extravars == {}
        for e in events:
            on_event(e)
        return Outcome(status="successful" if rc == 0 else "failed", rc=rc)
    return run


def test_ps_reads_every_nodes_answer_from_the_events(monkeypatch, tmp_path):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("n0\nn9\n")
    monkeypatch.setattr(ps_module, "run_playbook", fake_playbook([
        event("runner_on_start", "n0", {}), event("runner_on_start", "n9", {}),
        event("runner_on_ok", "n0", {"runs": [a_run("r1", "n0", 0)], "gpu_processes": None,
                                     "sees_all": True}),
        event("runner_on_unreachable", "n9", UNREACHABLE)], rc=4))
    report = ps(inventory)
    assert list(report.nodes) == ["n0", "n9"]
    assert report.exit_code == Exit.NODE_UNREACHABLE and "n9 (unreachable: " in report.reason
    jsonschema.validate(report.to_dict(), SCHEMA)

    # A node that started the task and never said more is named too.
    monkeypatch.setattr(ps_module, "run_playbook", fake_playbook([
        event("runner_on_start", "n0", {})], rc=1))
    assert ps(inventory).nodes["n0"].no_answer == "no answer"

    # No node at all, and ansible-playbook failed: its first words.
    monkeypatch.setattr(ps_module, "run_playbook", lambda *a, **k: Outcome(
        status="failed", rc=1, errors=["Unable to parse hosts.ini as an inventory source"]))
    failed = ps(inventory)
    assert (failed.exit_code, failed.reason) == (Exit.ERROR, "Unable to parse hosts.ini as an "
                                                             "inventory source")


def report() -> PsReport:
    return PsReport({
        "gpu01": NodeUse("gpu01", runs=[a_run("20261128-101500-3fa2", "gpu01", 0),
                                        a_run("old", "gpu01", 1, state="stale",
                                              job_state="stopped", exit_code=-15)],
                         gpu_processes=[{"pid": 777, "user": "bob", "gpu": 3,
                                         "used_memory_bytes": 1024 ** 3, "name": "python3"}],
                         sees_all=True),
        "gpu02": NodeUse("gpu02", gpu_processes=None, sees_all=True),
        "gpu03": NodeUse("gpu03", no_answer="unreachable: Connection refused"),
    }, checked_at=1795860999.0, exit_code=Exit.NODE_UNREACHABLE, reason="no answer from gpu03")


def test_the_table_has_a_row_per_run_per_node_and_per_foreign_gpu_process():
    shown = console()
    with shown.capture() as captured:
        shown.print(ps_table(report()))
    rows = [line.split() for line in captured.get().splitlines()]
    assert rows[0][:3] == ["node", "run", "id"]
    assert rows[1][:5] == ["gpu01", "20261128-101500-3fa2", "allreduce", "root", "0"]
    assert rows[1][5:8] == ["0,1", "2.0", "GiB"] and rows[1][-1] == "running"
    assert rows[2][1] == "old" and rows[2][-2:] == ["stale", "(stopped)"]
    assert rows[3][:6] == ["gpu01", "pid", "777", "python3", "bob", "-"]
    assert rows[3][-2:] == ["not", "torchherd's"]
    assert rows[4][0] == "gpu02" and rows[4][-1] == "idle"
    assert rows[5][0] == "gpu03" and " ".join(rows[5]).endswith("unreachable: Connection refused")


@pytest.mark.parametrize("as_json", [False, True])
def test_the_cli_prints_the_table_or_one_document_and_exits_as_status(as_json, monkeypatch,
                                                                      capsys):
    asked = {}

    def fake_ps(inventory, **kwargs):
        asked["inventory"] = inventory
        return report()

    monkeypatch.setattr("driver.api.ps", fake_ps)
    code = main(["ps", "-i", "inventories/cluster.ini", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == Exit.NODE_UNREACHABLE and asked["inventory"] == "inventories/cluster.ini"
    assert "ps: no answer from gpu03" in err
    if as_json:
        doc = json.loads(out)
        jsonschema.validate(doc, SCHEMA)
        assert doc["nodes"]["gpu01"]["runs"][0]["node_rank"] == 0
        assert doc["nodes"]["gpu03"]["no_answer"].startswith("unreachable")
    else:
        assert "20261128-101500-3fa2" in out and "not torchherd's" in out


def test_ps_needs_an_inventory(capsys):
    assert main(["ps", "--json"]) == Exit.USAGE
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["action"] == "ps" and "-i/--inventory" in doc["reason"]
