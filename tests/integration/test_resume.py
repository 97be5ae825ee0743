"""A job outlives a node: four container nodes, a three-node job, one node marked
torchherd_spare. A node killed mid-run (its container killed, as a machine losing power) is left
out, the spare takes its rank, and the job resumes from its last checkpoint with the same final
weights as a run that was never interrupted: by the driver's restart, and, for a detached job,
by torchrun's own restart with the spare waiting in its rendezvous. A rank raising in the job's
own code restarts only where the job asks for it. Real SSH, real gloo, real container kills."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver import collect, launch, launch_async, status
from tests.cluster import testbed
from tests.integration.helpers import EXAMPLES, assert_no_job_left, per_node, wait_for

pytestmark = pytest.mark.cluster

JOB_PROCESSES = r"torch\.distributed\.run|train_ddp\.py|allreduce\.py"
DONE = re.compile(r"torchherd-train done epochs=(\d+) weights=(\S+)")


@pytest.fixture(scope="module")
def cluster4(node_image: str) -> Iterator[tuple[testbed.Cluster, Path]]:
    """Four nodes, the last one a spare; the module's tests share them (one is killed last)."""
    with testbed.reserve("resume"):
        try:
            cluster = testbed.up("resume", 4)
            yield cluster, cluster.write_inventory({"node3": {"torchherd_spare": "true"}})
        finally:
            testbed.down("resume")


def train(run_id: str, ckpt: str, **extra) -> dict:
    return {"script": "train_ddp.py", "code_src": str(EXAMPLES), "nproc_per_node": 2,
            "args": ["--epochs", "8", "--epoch-seconds", "1", "--ckpt-dir", ckpt],
            "run_id": run_id, **extra}


def final_weights(runs: Path, run_id: str, host: str) -> str:
    log = (runs / run_id / "nodes" / host / "node.log").read_text()
    found = DONE.findall(log)
    assert found, log[-2000:]
    return found[-1][1]


def no_job_left(cluster: testbed.Cluster, nodes, run_id: str = "") -> None:
    """No job process on the nodes, and no firewall rule of the run."""
    assert_no_job_left(cluster, JOB_PROCESSES, nodes)
    for node in nodes:
        if run_id:
            rules = cluster.exec(node, ["nft", "list", "ruleset"]).stdout
            assert run_id not in rules, f"a rule of run {run_id} is left on {node.name}"


def test_an_exception_restarts_only_where_the_job_asks(cluster4, tmp_path):
    cluster, inventory = cluster4
    names = [n.name for n in cluster.nodes]
    job = {"script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 1,
           "args": ["--fail-rank", "1"], "restarts": 2}
    result = launch({**job, "run_id": "raise"}, inventory, runs_dir=tmp_path)
    assert result.state == "failed" and result.incidents == [], result.reason
    assert not (tmp_path / "raise" / "restarts").exists()

    # Asked to (restart_on: exception): every restart fails the same way; none is left out,
    # and each incident is in summary.json.
    result = launch({**job, "run_id": "raise-again", "restart_on": ["exception"]}, inventory,
                    runs_dir=tmp_path)
    assert result.state == "failed", result.reason
    assert [(i["restart"], i["kind"], i["node"]) for i in result.incidents] == [
        (1, "exception", None), (2, "exception", None)]
    summary = json.loads((tmp_path / "raise-again" / "summary.json").read_text())
    assert summary["incidents"] == result.incidents and summary["restart"] == 2
    # Every launch's records are kept: the run directory's, and each node's.
    for n in (0, 1):
        kept = tmp_path / "raise-again" / "restarts" / str(n)
        assert (kept / "summary.json").exists() and (kept / "nodes" / names[0]).is_dir()
    node_kept = cluster.exec(cluster.nodes[0], ["ls", "/root/.torchherd/runs/raise-again/restarts"])
    assert node_kept.stdout.split() == ["0", "1"]
    no_job_left(cluster, cluster.nodes, "raise-again")


# The final weights of an uninterrupted run (3 nodes x 2 processes), made once for the module.
REFERENCE: dict[str, str] = {}


def reference_weights(cluster: testbed.Cluster, inventory: Path, runs: Path) -> str:
    if "weights" not in REFERENCE:
        reference = launch(train("reference", "/root/ck-reference"), inventory, runs_dir=runs)
        assert reference.ok, reference.reason
        REFERENCE["weights"] = final_weights(runs, "reference", cluster.nodes[0].name)
    return REFERENCE["weights"]


def kill_after_three_epochs(cluster: testbed.Cluster, run_id: str, index: int) -> float:
    """Kill node `index` once the first node logged three epochs; returns when it was."""

    def epochs() -> int:
        log = cluster.exec(cluster.nodes[0], ["cat", f"/root/.torchherd/runs/{run_id}/node.log"],
                           check=False).stdout
        return len(re.findall(r"torchherd-train epoch=\d+", log))

    wait_for(lambda: epochs() >= 3, 180, "three epochs", interval=0.3)
    killed_at = time.time()
    cluster.kill(cluster.nodes[index])
    return killed_at


def test_a_node_killed_mid_run_is_replaced_and_the_job_resumes(cluster4, tmp_path):
    cluster, inventory = cluster4
    names = [n.name for n in cluster.nodes]
    expected = reference_weights(cluster, inventory, tmp_path)

    handle = launch_async(train("resume", "/root/ck-resume", restarts=1), inventory,
                          runs_dir=tmp_path)

    killed_at = kill_after_three_epochs(cluster, "resume", 1)
    result = handle.wait(600)
    assert result.ok, result.reason
    [incident] = result.incidents
    assert incident["kind"] == "node_lost" and incident["node"] == names[1], incident
    assert incident["replaced_by"] == names[3] and incident["node_rank"] == 1
    assert result.hosts[names[3]]["node_rank"] == 1
    assert names[1] in result.left_out
    # Resumed from a checkpoint, not from the start, and with the weights of a run never
    # interrupted.
    log = (tmp_path / "resume" / "nodes" / names[0] / "node.log").read_text()
    start = int(re.search(r"start_epoch=(\d+) world_size=6 restart=1", log).group(1))
    assert start >= 2, log[-2000:]
    assert final_weights(tmp_path, "resume", names[0]) == expected
    summary = json.loads((tmp_path / "resume" / "summary.json").read_text())
    assert summary["incidents"] == result.incidents
    first = min(h["first_output_at"] for h in summary["hosts"].values()
                if h["first_output_at"] is not None)
    assert incident["first_output_after"] is not None and incident["first_output_after"] > 0
    # Timed from the moment the master's gang saw the killed node's link close.
    assert killed_at - 1 < incident["at"] < killed_at + 15, (killed_at, incident)
    print(f"kill to the resumed job's first output: {first - killed_at:.1f} s; "
          f"incident: {incident}")
    no_job_left(cluster, [cluster.nodes[0], cluster.nodes[2], cluster.nodes[3]], "resume")


def test_a_detached_job_resumes_on_its_standby_without_the_controller(cluster4, tmp_path):
    """restarts with detach: torchrun restarts the workers itself, and the spare, started with
    the others, waits in its rendezvous and takes the killed node's place. Nothing on the
    controller runs between the launch and the collect."""
    cluster, _ = cluster4
    cluster = testbed.up("resume", 4)  # every node back: the test before killed one
    inventory = cluster.write_inventory({"node3": {"torchherd_spare": "true"}})
    names = [n.name for n in cluster.nodes]
    expected = reference_weights(cluster, inventory, tmp_path)
    spec = train("standby", "/root/ck-standby", restarts=1, detach=True, rdzv="c10d",
                 restart_on=["node_lost", "signal", "connection", "exception"])
    launched = launch(spec, inventory, runs_dir=tmp_path)
    assert launched.state == "running", launched.reason
    schedule = json.loads((tmp_path / "standby" / "schedule.json").read_text())
    assert schedule["restart"]["by"] == "torchrun" and schedule["restart"]["launcher"] == 1
    assert schedule["restart"]["standbys"] == [names[3]]
    assert launched.hosts[names[3]]["standby"] and launched.left_out == {}

    killed_at = kill_after_three_epochs(cluster, "standby", 2)

    # Until the job ended on every node left (its run record says so on the node: a look that
    # costs no playbook run, where each status below is one, on every node), then status says
    # so too.
    def ended(node: testbed.Node) -> bool:
        record = cluster.exec(node, ["cat", "/root/.torchherd/runs/standby/run.json"],
                              check=False).stdout
        return bool(record) and json.loads(record).get("job", {}).get("ended_at") is not None

    left = [cluster.nodes[0], cluster.nodes[1], cluster.nodes[3]]
    wait_for(lambda: all(per_node(ended, left)), 300, "the job's end on the nodes left", interval=1)
    deadline = time.monotonic() + 60
    while True:
        seen = status("standby", runs_dir=tmp_path)
        if not any(h["state"] == "running" for h in seen.hosts.values()):
            break
        assert time.monotonic() < deadline, f"still running: {seen.reason}"
        time.sleep(3)
    # The killed node, seen running at the launch, does not answer now.
    assert seen.hosts[names[2]]["state"] in ("lost", "unreachable"), seen.hosts[names[2]]
    result = collect("standby", runs_dir=tmp_path)
    assert result.ok, result.reason
    states = {name: h["state"] for name, h in result.hosts.items()}
    assert states[names[2]] in ("lost", "unreachable"), states
    assert {states[n] for n in (names[0], names[1], names[3])} == {"succeeded"}, states
    [incident] = result.incidents
    assert (incident["by"], incident["kind"], incident["node"], incident["replaced_by"]) == (
        "torchrun", "node_lost", names[2], names[3]), incident
    assert killed_at - 1 < incident["at"] < killed_at + 30, (killed_at, incident)
    # torchrun drops the lost node once its heartbeat lapses (about 15 s), then restarts.
    assert 5 < incident["first_output_after"] < 120, incident
    # Resumed by torchrun from a checkpoint, with the standby, and the weights of a run never
    # interrupted.
    log = (tmp_path / "standby" / "nodes" / names[0] / "node.log").read_text()
    start = int(re.search(r"start_epoch=(\d+) world_size=6 restart=1", log).group(1))
    assert start >= 2, log[-2000:]
    assert final_weights(tmp_path, "standby", names[0]) == expected
    print(f"detached: kill to the resumed job's first output: "
          f"{incident['first_output_after']} s; incident: {incident}")
    no_job_left(cluster, [cluster.nodes[0], cluster.nodes[1], cluster.nodes[3]], "standby")
