"""Job lifecycle on the container cluster: fail-fast, lost nodes, stop, elastic, resume."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time

import pytest

from driver import launch
from driver.api import Exit
from driver.runner import run_playbook
from driver.spec import JobSpecError
from tests.integration.helpers import (
    EXAMPLES,
    assert_failed_fast,
    assert_no_job_left,
    per_node,
    wait_for,
)

pytestmark = pytest.mark.cluster

JOB_PROCS = r"torch\.distributed\.run|allreduce\.py|train_ddp\.py"


def job(script="allreduce.py", *args, **extra):
    return {"script": script, "args": list(args), "code_src": str(EXAMPLES), "nproc_per_node": 2,
            **extra}


def summary(runs, run_id):
    return json.loads((runs / run_id / "summary.json").read_text())


def act(action, cluster, runs, run_id):
    """Run stop/status/collect for a run id, as the driver does."""
    return run_playbook(action, cluster.inventory,
                        {"torchherd_run_id": run_id, "torchherd_runs_dir": str(runs)})


def running_everywhere(cluster, nodes=None):
    return all(per_node(lambda n: cluster.pids(n, r"allreduce\.py|train_ddp\.py"),
                        nodes or cluster.nodes))


def reduced_everywhere(cluster, run_id):
    """Both ranks of every node printed their all-reduce: the job is past its start."""
    logs = per_node(lambda n: cluster.exec(n, ["cat", f"/root/.torchherd/runs/{run_id}/node.log"],
                                           check=False).stdout, cluster.nodes)
    return all(log.count("torchherd-allreduce ok") >= 2 for log in logs)


def test_rank_failure_stops_every_node_fast(cluster3, tmp_path):
    # Rank 3 (node 1) fails 3 s after the all-reduce; every other rank would sleep 120 s.
    result = launch(job("allreduce.py", "--fail-rank", "3", "--fail-after", "3",
                        "--sleep", "120", run_id="failfast"), cluster3.inventory,
                    runs_dir=tmp_path)
    returned = time.time()
    assert result.exit_code == Exit.JOB_FAILED, result.reason
    s = summary(tmp_path, "failfast")
    assert {s["hosts"][h]["state"] for h in ("it3-node0", "it3-node2")} == {"stopped"}
    for node in cluster3.nodes:
        assert (tmp_path / "failfast" / "nodes" / node.name / "node.log").exists()
    assert_failed_fast(tmp_path / "failfast", cluster3, 3, "injected failure on rank 3",
                       returned, "allreduce", JOB_PROCS)


def test_stop_detached_job(cluster3, tmp_path, own_masters):
    cpdir = own_masters
    result = launch(job("allreduce.py", "--sleep", "300", run_id="detached", detach=True),
                    cluster3.inventory, runs_dir=tmp_path)
    assert result.exit_code == Exit.OK and result.state == "running", result.reason
    assert running_everywhere(cluster3)
    # The controller's SSH connections dropping does not touch a detached job (the launch's
    # own: other tests run beside this one).
    subprocess.run(["pkill", "-f", f"ssh: {cpdir}/"], check=True)  # check: there were some
    for node in cluster3.nodes:
        cluster3.exec(node, ["pkill", "-f", "sshd: root"], check=False)
    time.sleep(2)
    assert running_everywhere(cluster3)
    status = act("status", cluster3, tmp_path, "detached")
    assert status.rc == 0
    assert summary(tmp_path, "detached")["state"] == "running"

    start = time.monotonic()
    stopped = act("stop", cluster3, tmp_path, "detached")
    took = time.monotonic() - start
    assert stopped.rc == 0
    s = summary(tmp_path, "detached")
    assert s["state"] == "stopped"
    assert {h["state"] for h in s["hosts"].values()} == {"stopped"}
    assert_no_job_left(cluster3, JOB_PROCS)
    assert ":29500 " not in cluster3.exec(0, ["ss", "-ltn"]).stdout
    for node in cluster3.nodes:
        assert (tmp_path / "detached" / "nodes" / node.name / "node.log").exists()
    print(f"stop took {took:.1f} s")


def test_second_launch_of_a_running_run_id_is_refused(cluster3, tmp_path):
    first = launch(job("allreduce.py", "--sleep", "300", run_id="twice", detach=True),
                   cluster3.inventory, runs_dir=tmp_path)
    try:
        assert first.state == "running", first.reason
        with pytest.raises(JobSpecError, match="expected a new run id, found run twice"):
            launch(job("allreduce.py", run_id="twice"), cluster3.inventory, runs_dir=tmp_path)
        # Another job, on another port, runs beside the first one.
        other = launch(job("allreduce.py", run_id="beside", master_port=29600),
                       cluster3.inventory, runs_dir=tmp_path)
        assert other.ok, other.reason
        # The master port of the running job is in use: caught before launch.
        clash = launch(job("allreduce.py", run_id="clash"), cluster3.inventory,
                       runs_dir=tmp_path)
        assert clash.exit_code == Exit.PREFLIGHT_FAILED and "29500" in clash.reason
        assert running_everywhere(cluster3)
    finally:
        act("stop", cluster3, tmp_path, "twice")
    assert_no_job_left(cluster3, JOB_PROCS)


def test_killed_node_is_named_and_the_rest_stop(make_cluster, tmp_path):
    cluster = make_cluster("lckill", 3)
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(result=launch(
        job("allreduce.py", "--sleep", "300", run_id="killed"), cluster.inventory,
        runs_dir=tmp_path)))
    runner.start()
    wait_for(lambda: reduced_everywhere(cluster, "killed"), 180, "the all-reduce on every node")
    killed_at = time.time()
    cluster.kill(2)
    runner.join(120)
    assert not runner.is_alive(), "launch did not return after a node was killed"
    result = outcome["result"]
    assert result.exit_code == Exit.NODE_UNREACHABLE, result.reason
    assert "lckill-node2" in result.reason
    s = summary(tmp_path, "killed")
    assert s["hosts"]["lckill-node2"]["state"] == "lost"
    for node in cluster.nodes[:2]:
        assert s["hosts"][node.name]["state"] in ("stopped", "failed")
        assert (tmp_path / "killed" / "nodes" / node.name / "node.log").exists()
    assert_no_job_left(cluster, JOB_PROCS, cluster.nodes[:2])
    print(f"node killed -> launch returned {time.time() - killed_at:.1f} s")


def test_a_dropped_ssh_connection_mid_watch_does_not_stop_the_job(cluster3, tmp_path,
                                                                  own_masters):
    # Every SSH master of the launch dies while the watch's wait is in flight (a hiccup, not a
    # dead node): the wait fails with a connection error, asks once more on a fresh connection,
    # and the job runs to its end. Without the second try the node would count as lost and the
    # job be stopped. (The watch waits on the master alone: the nodes form the gang.)
    cpdir = own_masters
    waiting, output, outcome = set(), [], {}

    def on_event(event):
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_start" and data.get("task") == "Wait for the job":
            waiting.add(data.get("host"))
        output.append(event.get("stdout") or "")

    runner = threading.Thread(target=lambda: outcome.update(result=launch(
        job("allreduce.py", "--sleep", "25", run_id="hiccup"), cluster3.inventory,
        runs_dir=tmp_path, on_event=on_event)))
    runner.start()
    wait_for(lambda: waiting, 120, "the watch's wait")

    # Until the wait's module runs on the master (Ansible's command for a module there ends in
    # "&& sleep 0"): a connection cut before it would test the wait's start, not its retry.
    def wait_runs() -> bool:
        return cluster3.exec(0, ["pgrep", "-f", "&& sleep 0"], check=False).returncode == 0

    wait_for(wait_runs, 60, "the wait's module on the master", interval=0.2)
    masters = subprocess.run(["pgrep", "-f", f"ssh: {cpdir}"], capture_output=True, text=True)
    assert masters.stdout.split(), "no SSH master of the launch found"
    subprocess.run(["pkill", "-KILL", "-f", f"ssh: {cpdir}"], check=True)
    runner.join(180)
    assert not runner.is_alive(), "launch did not return"
    result = outcome["result"]
    assert result.ok, result.reason
    s = summary(tmp_path, "hiccup")
    assert [h["state"] for h in s["hosts"].values()] == ["succeeded"] * len(cluster3.nodes)
    retried = "".join(output).count("asking once more on a fresh connection")
    assert retried >= 1, "no wait lost its connection: the test did not test the retry"


def test_elastic_job_survives_a_lost_node(make_cluster, tmp_path):
    cluster = make_cluster("lcelastic", 3)
    outcome = {}
    # The process-group timeout is how long the survivors' barrier waits for the dead node,
    # and also how long re-connecting after the restart may take on a loaded machine. The two
    # survivors may restart out of step (one's workers still in the barrier when the other's
    # re-join), which costs a restart; three are plenty. (With torch's shared worker store,
    # every restart failed with "connectFullMesh ... Connection refused": see docs/lifecycle.md.)
    spec = job("allreduce.py", "--sleep", "12", "--pg-timeout", "20", run_id="elastic",
               rdzv="c10d", nnodes="2:3", max_restarts=3,
               rdzv_conf={"last_call_timeout": 2})
    runner = threading.Thread(target=lambda: outcome.update(
        result=launch(spec, cluster.inventory, runs_dir=tmp_path)))
    runner.start()
    # Lose the node while the job runs (after init and the first all-reduce), not while the
    # group is still forming.
    wait_for(lambda: reduced_everywhere(cluster, "elastic"), 180,
             "the first all-reduce on every node")
    cluster.kill(2)
    runner.join(240)
    assert not runner.is_alive(), "the elastic job did not finish"
    result = outcome["result"]
    assert result.ok, result.reason
    s = summary(tmp_path, "elastic")
    assert s["hosts"]["lcelastic-node2"]["state"] == "lost"
    assert "elastic" in s["reason"]
    logs = "".join((tmp_path / "elastic" / "nodes" / n.name / "node.log").read_text()
                   for n in cluster.nodes[:2])
    # The second attempt ran on the two nodes left: world size 4, sum 0+1+2+3.
    assert re.search(r"torchherd-allreduce ok .* sum=6 expected=6", logs)
    assert_no_job_left(cluster, JOB_PROCS, cluster.nodes[:2])


def test_train_ddp_resumes_from_checkpoint(cluster3, tmp_path):
    # Epochs enough that the stop, a whole playbook run, comes well before the last of them
    # also on a loaded machine (with 6, three cluster workers once let the job finish first);
    # the resumed run's epochs take no set time.
    first = launch(job("train_ddp.py", "--epochs", "12", "--epoch-seconds", "1.5",
                       "--ckpt-dir", "/root/ckpt-resume", run_id="train1", detach=True),
                   cluster3.inventory, runs_dir=tmp_path)
    assert first.state == "running", first.reason

    def epochs_done():
        out = cluster3.exec(0, ["sh", "-c", "cat /root/.torchherd/runs/train1/node.log"],
                            check=False).stdout
        return len(re.findall(r"torchherd-train epoch=\d+", out))

    wait_for(lambda: epochs_done() >= 2, 120, "two epochs")
    assert act("stop", cluster3, tmp_path, "train1").rc == 0
    done_before = epochs_done()
    assert done_before < 12
    second = launch(job("train_ddp.py", "--epochs", "12", "--ckpt-dir", "/root/ckpt-resume",
                        run_id="train2"), cluster3.inventory, runs_dir=tmp_path)
    assert second.ok, second.reason
    log = (tmp_path / "train2" / "nodes" / "it3-node0" / "node.log").read_text()
    start = int(re.search(r"start_epoch=(\d+)", log).group(1))
    # A stop between saving a checkpoint and printing its line leaves one more epoch done.
    assert start in (done_before, done_before + 1), (start, done_before)
    assert start >= 2
    assert "torchherd-train done epochs=12" in log
    for node in cluster3.nodes:  # every node keeps its own checkpoint
        cluster3.exec(node, ["rm", "-rf", "/root/ckpt-resume"])
