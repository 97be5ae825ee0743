"""Real launches over SSH into the container cluster: torchrun, gloo, rsync, log collection."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from driver import launch
from driver.api import Exit
from tests.integration.helpers import EXAMPLES, JOB_PROCS, assert_no_job_left

pytestmark = pytest.mark.cluster

OK_LINE = re.compile(
    r"torchherd-allreduce ok host=(\S+) node_rank=(\d+) local_rank=(\d+) "
    r"rank=(\d+) sum=(\S+) expected=(\S+)"
)


def allreduce_job(**extra):
    return {"script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 2, **extra}


def test_allreduce_three_nodes_two_procs(cluster3, tmp_path):
    # Samples of each node's use, often enough for a job of a few seconds.
    job = allreduce_job(args=["--result-dir", "results"], artifacts=["results/*.json"],
                        sample_interval=0.25)
    result = launch(job, cluster3.inventory, runs_dir=tmp_path)
    assert result.ok, result.reason
    assert result.summary["world_size"] == 6
    # The launchers started ahead: started during the launch, done with their imports before
    # a rank said anything (what their imports saved is in these timings).
    timings = result.timings
    assert 0 < timings["launcher_started"] <= timings["launcher_ready"] \
        <= timings["first_output"] < timings["wall"], timings

    run_dir = tmp_path / result.run_id
    # Each phase's end, as the launch recorded it in the run directory (run_record's mark).
    marks = json.loads((run_dir / "marks.json").read_text())
    assert list(marks) == ["collect", "plan", "preflight", "watch"], marks
    assert marks["plan"] < marks["preflight"] < marks["watch"] <= marks["collect"], marks
    assert {"plan", "preflight", "watch", "collect"} <= set(timings), timings
    seen_ranks = {}
    for node_rank, node in enumerate(cluster3.nodes):
        host = result.hosts[node.name]
        assert host["node_rank"] == node_rank
        assert host["state"] == "succeeded" and host["exit_code"] == 0
        # The launcher preflight started ahead over SSH ran the job (the schedule's start.warm).
        assert host["warm"] and host["warm"]["used"], host["warm"]
        # The node's CPU and memory were sampled while the job ran (no GPU, no nvidia-smi:
        # no GPU samples); the record that came back keeps every point.
        use = host["use"]
        assert use["stats"]["mean_cpu"] is not None and use["stats"]["peak_memory_mib"] > 0, use
        assert use["recent"] and use["stats"]["gpus"] == [] and "gpus" not in use, use
        record = json.loads((run_dir / "nodes" / node.name / "run.json").read_text())
        assert len(record["use"]["points"]) >= 2, record["use"]
        assert use["stats"]["samples"] == sum(p[1] for p in record["use"]["points"])
        log = run_dir / "nodes" / node.name / "node.log"
        assert log.is_file(), f"log of {node.name} did not come back"
        # Per-rank logs came back too, one directory per local rank.
        assert (
            len(list((run_dir / "nodes" / node.name).glob("torchrun/*/attempt_0/*/stdout.log")))
            == 2
        )
        for match in OK_LINE.finditer(log.read_text()):
            hostname, nrank, _local, rank, total, expected = match.groups()
            # The line was written on the node itself: its own hostname and node rank.
            assert hostname == node.name
            assert int(nrank) == node_rank
            assert float(total) == float(expected) == 15.0
            seen_ranks[int(rank)] = hostname
    assert sorted(seen_ranks) == list(range(6)), seen_ranks

    # The merged log carries host and global rank on every line, and they agree with the text.
    merged = (run_dir / "merged.log").read_text().splitlines()
    oks = [line for line in merged if "torchherd-allreduce ok" in line]
    assert len(oks) == 6
    for line in oks:
        host, who = line.split(":", 1)[0].split()
        assert f"host={host} " in line and f" rank={who[1:]} " in line
    # Artifacts came back from every node.
    for node_rank, node in enumerate(cluster3.nodes):
        art = run_dir / "artifacts" / node.name / "results" / f"allreduce-{node.name}.json"
        assert json.loads(art.read_text())["node_rank"] == node_rank

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state"] == "succeeded" and summary["idle_gpus"] == {}
    assert set(summary["timings"]) >= {"preflight", "sync", "start", "watch", "collect"}
    # The code really was copied onto each node's own file system.
    for node in cluster3.nodes:
        synced = cluster3.exec(node, ["ls", "/root/.torchherd/code/allreduce"]).stdout
        assert "allreduce.py" in synced
        assert cluster3.pids(node, JOB_PROCS) == []


class NodeTasks:
    """From a launch's events: every task that ran on each node, in order, and its result."""

    def __init__(self):
        self.ran = {}

    def __call__(self, event):
        data = event.get("event_data") or {}
        if event.get("event") in ("runner_on_ok", "runner_on_failed") and data.get("host"):
            self.ran.setdefault(data["host"], []).append((data.get("task"), data.get("res")))

    def names(self, host):
        return [task for task, _res in self.ran.get(host, [])]


def barrier_where(runs, result, host):
    """Where the node's barrier ran, as its run-state record says: the start, or the facts."""
    record = json.loads((runs / result.run_id / "nodes" / host / "run.json").read_text())
    return record["barrier"]["where"]


def test_relaunch_sends_no_unchanged_code(cluster3, tmp_path):
    code = tmp_path / "code"
    shutil.copytree(EXAMPLES, code)
    runs = tmp_path / "runs"
    first = launch(allreduce_job(code_src=str(code)), cluster3.inventory, runs_dir=runs)
    tasks = NodeTasks()
    second = launch(allreduce_job(code_src=str(code)), cluster3.inventory, runs_dir=runs,
                    on_event=tasks)
    assert first.ok and second.ok
    assert first.run_id != second.run_id
    # The relaunch of the same job on the same nodes: each node's start came with its facts
    # call (the schedule's start.with_facts), one module call per node up to the start; the
    # start task did not run anywhere.
    schedule = json.loads((runs / second.run_id / "schedule.json").read_text())
    assert schedule["start"]["with_facts"] and first.run_id in schedule["why"]["with_facts"]
    verdict = json.loads((runs / second.run_id / "preflight.json").read_text())["gate"]
    assert verdict["with_facts"] == {"started": True, "refused": {}, "called_off": None}
    for node in cluster3.nodes:
        ran = tasks.names(node.name)
        assert ran[0] == "Gather node facts" and "Start torchrun on every node" not in ran, ran
        assert tasks.ran[node.name][0][1]["start"]["started"] is True
        assert barrier_where(runs, second, node.name) == "facts"
        assert second.hosts[node.name]["state"] == "succeeded"
        assert second.hosts[node.name]["warm"]["used"], second.hosts[node.name]["warm"]
    assert barrier_where(runs, first, cluster3.nodes[0].name) == "start"
    # The code on the nodes is what the controller has: the relaunch sends nothing to any of
    # them (the nodes' own hash of their copy said so in preflight: code_current).
    assert second.sync == {"files": 0, "bytes": 0, "nodes_sent_to": 0}, second.sync
    for host in second.hosts.values():
        assert host["sync"] == {"files": 0, "bytes": 0}, host["sync"]
    facts = json.loads((runs / second.run_id / "preflight.json").read_text())["facts"]
    assert all(f["code_current"] for f in facts.values()), facts
    # Each run keeps its own directory of logs.
    assert (runs / first.run_id / "summary.json").exists()
    assert (runs / second.run_id / "summary.json").exists()
    # One file changed: the next launch sends it, and only it, to every node.
    with open(code / "allreduce.py", "a", encoding="utf-8") as handle:
        handle.write("# changed\n")
    third = launch(allreduce_job(code_src=str(code)), cluster3.inventory, runs_dir=runs)
    assert third.ok, third.reason
    assert third.sync["nodes_sent_to"] == len(cluster3.nodes), third.sync
    facts = json.loads((runs / third.run_id / "preflight.json").read_text())["facts"]
    assert not any(f["code_current"] for f in facts.values()), facts
    assert all(h["sync"]["files"] == 1 for h in third.hosts.values()), third.hosts
    # Other code is another job: its first launch took the full path.
    assert not json.loads((runs / third.run_id / "schedule.json").read_text())["start"][
        "with_facts"]
    # Someone edits the copy on one node: relaunched, that node refuses at the barrier (its
    # code is not the controller's), the start is called off on every node, and the launch
    # takes the full path: the gate on the fresh facts, the sync to that node alone, the start.
    changed = cluster3.nodes[1]
    cluster3.exec(changed, ["sh", "-c",
                            "echo '# edited' >> /root/.torchherd/code/allreduce/allreduce.py"])
    fourth = launch(allreduce_job(code_src=str(code)), cluster3.inventory, runs_dir=runs)
    assert fourth.ok, fourth.reason
    verdict = json.loads((runs / fourth.run_id / "preflight.json").read_text())["gate"]
    assert verdict["with_facts"]["started"] is False, verdict["with_facts"]
    assert verdict["with_facts"]["refused"] == {
        changed.name: "the code on the node is not the controller's"}, verdict["with_facts"]
    assert changed.name in verdict["with_facts"]["called_off"]
    assert fourth.sync["nodes_sent_to"] == 1, fourth.sync
    assert [h for h, e in fourth.hosts.items() if e["sync"]["files"]] == [changed.name]
    for node in cluster3.nodes:
        assert barrier_where(runs, fourth, node.name) == "start"
        assert fourth.hosts[node.name]["state"] == "succeeded"
    assert_no_job_left(cluster3)


def test_unreachable_node_fails_before_anything_starts(cluster3, tmp_path):
    dead = cluster3.nodes[1]
    cluster3.stop_sshd(dead)
    # Existing sessions (an Ansible ControlPersist master among them) would survive a stopped
    # sshd; end them so the node is as unreachable as a machine whose sshd is down.
    cluster3.exec(dead, ["pkill", "-x", "sshd"], check=False)
    try:
        result = launch(
            allreduce_job(run_id="unreachable-1"), cluster3.inventory, runs_dir=tmp_path
        )
    finally:
        cluster3.start_sshd(dead)
    assert result.exit_code == Exit.NODE_UNREACHABLE, result.reason
    assert dead.name in result.reason
    preflight = json.loads((tmp_path / "unreachable-1" / "preflight.json").read_text())
    assert [p["host"] for p in preflight["gate"]["problems"]] == [dead.name]
    assert_no_job_left(cluster3)
    for node in cluster3.nodes:
        left = cluster3.exec(
            node, ["test", "-e", "/root/.torchherd/runs/unreachable-1"], check=False
        )
        assert left.returncode != 0, f"the run started on {node.name}"
