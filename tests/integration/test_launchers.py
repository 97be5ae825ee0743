"""launcher accelerate on the container cluster: the plan's ranks and counts, the user's config
file, a failing process, and preflight's check that every node has it."""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest

from driver import launch, status, stop, verify
from driver.api import Exit
from tests.integration.helpers import EXAMPLES, assert_failed_fast, assert_no_job_left

pytestmark = pytest.mark.cluster

JOB_PROCS = (r"torch\.distributed\.run|accelerate\.commands\.launch|accelerate_gather\.py|"
             r"deepspeed\.launcher\.launch|deepspeed_step\.py")
LINE = re.compile(r"torchherd-accelerate (\w+) host=(\S+) process_index=(\d+) "
                  r"local_process_index=(\d+) num_processes=(\d+) node_rank=(\S+) "
                  r"distributed_type=(\S+) mixed_precision=(\S+) "
                  r"gradient_accumulation_steps=(\d+) gathered=(\S+)")


def job(run_id, *args, launcher="accelerate", script="accelerate_gather.py", **extra):
    return {"script": script, "args": list(args), "code_src": str(EXAMPLES),
            "nproc_per_node": 2, "launcher": launcher, "run_id": run_id, **extra}


def lines(runs, run_id, cluster, pattern=LINE):
    """The groups of every match of pattern in every node's log."""
    found = []
    for node in cluster.nodes:
        log = (runs / run_id / "nodes" / node.name / "node.log").read_text()
        found += [m.groups() for m in pattern.finditer(log)]
    return found


def test_accelerate_makes_one_world_of_every_node(cluster3, tmp_path):
    result = launch(job("acc-world"), cluster3.inventory, runs_dir=tmp_path)
    assert result.ok, result.reason
    found = lines(tmp_path, "acc-world", cluster3)
    assert sorted(int(f[2]) for f in found) == list(range(6)), found
    for ok, host, index, local, count, node_rank, kind, precision, _gas, gathered in found:
        assert ok == "ok" and count == "6" and gathered == "0,1,2,3,4,5"
        assert kind == "MULTI_CPU" and precision == "no"
        # Process index = node rank * processes per node + local index, nodes in inventory order.
        rank_of_host = [n.name for n in cluster3.nodes].index(host)
        assert int(index) == 2 * rank_of_host + int(local) and int(node_rank) == rank_of_host
    node_dir = tmp_path / "acc-world" / "nodes" / cluster3.nodes[1].name
    argv = json.loads((node_dir / "cmd.json").read_text())
    assert argv[1:3] == ["-m", "accelerate.commands.launch"]
    assert argv[argv.index("--machine_rank") + 1] == "1"
    # accelerate's launch imported ahead in preflight ran the job on every node (start.warm).
    assert all((h["warm"] or {}).get("used") for h in result.hosts.values()), result.hosts
    assert json.loads((node_dir / "env.json").read_text())["ACCELERATE_USE_CPU"] == "1"
    assert_no_job_left(cluster3, JOB_PROCS)


def test_accelerate_with_one_process_in_all_runs_without_multi_gpu(cluster3, tmp_path):
    """One node of one process, as on a machine with one GPU: accelerate refuses --multi_gpu
    below two processes, so the start leaves it out and accelerate runs the script itself."""
    node = cluster3.nodes[0].name
    result = launch(job("acc-one", nproc_per_node=1, nodes=[node]), cluster3.inventory,
                    runs_dir=tmp_path)
    assert result.ok, result.reason
    log = (tmp_path / "acc-one" / "nodes" / node / "node.log").read_text()
    found = [m.groups() for m in LINE.finditer(log)]
    assert [(f[0], f[2], f[4], f[9]) for f in found] == [("ok", "0", "1", "0")], log
    argv = json.loads((tmp_path / "acc-one" / "nodes" / node / "cmd.json").read_text())
    assert "--multi_gpu" not in argv and argv[argv.index("--num_processes") + 1] == "1"
    assert_no_job_left(cluster3, JOB_PROCS)


def test_the_users_accelerate_config_is_honoured(cluster3, tmp_path):
    code = tmp_path / "code"
    shutil.copytree(EXAMPLES, code)
    (code / "accelerate.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"
        "mixed_precision: bf16\n")
    result = launch(job("acc-config", code_src=str(code),
                        launcher_args=["--config_file", "accelerate.yaml"]),
                    cluster3.inventory, runs_dir=tmp_path / "runs")
    assert result.ok, result.reason
    found = lines(tmp_path / "runs", "acc-config", cluster3)
    assert len(found) == 6 and {f[7] for f in found} == {"bf16"}, found
    assert {f[0] for f in found} == {"ok"}


def test_a_failing_process_under_accelerate_stops_every_node_fast(cluster3, tmp_path):
    result = launch(job("acc-fail", "--fail-rank", "3"), cluster3.inventory, runs_dir=tmp_path)
    returned = time.time()
    assert result.exit_code == Exit.JOB_FAILED, result.reason
    assert_failed_fast(tmp_path / "acc-fail", cluster3, 3, "injected failure on process 3",
                       returned, "accelerate", JOB_PROCS)


def test_preflight_refuses_a_node_without_accelerate(cluster3, tmp_path):
    node = cluster3.nodes[2]
    site = cluster3.exec(node, ["python3", "-c", "import accelerate, os; print(os.path.dirname("
                                "os.path.dirname(accelerate.__file__)))"]).stdout.strip()
    info = cluster3.exec(node, ["sh", "-c", f"ls -d {site}/accelerate-*.dist-info"]).stdout.strip()
    cluster3.exec(node, ["mv", info, "/root/accelerate.dist-info.off"])
    try:
        result = verify(job("acc-missing"), cluster3.inventory, runs_dir=tmp_path)
    finally:
        cluster3.exec(node, ["mv", "/root/accelerate.dist-info.off", info])
    assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
    assert [(p["host"], p["check"]) for p in result.problems] == [(node.name, "accelerate")]
    assert result.problems[0]["found"] == "not installed"


DS_LINE = re.compile(r"torchherd-deepspeed (\w+) host=(\S+) node_rank=\S+ local_rank=(\d+) "
                     r"rank=(\d+) world_size=(\d+) micro_batch=(\d+) "
                     r"gradient_accumulation_steps=(\d+) sum=(\S+) expected=(\S+)")


def ds_job(run_id, *args, **extra):
    return job(run_id, *args, launcher="deepspeed", script="deepspeed_step.py", **extra)


def test_deepspeed_trains_in_one_world_with_the_users_config(cluster3, tmp_path):
    """DeepSpeed's per-node launcher on every node (no pdsh), the plan's world, and the user's
    DeepSpeed config file synced with the code."""
    code = tmp_path / "code"
    shutil.copytree(EXAMPLES, code)
    (code / "ds_config.json").write_text(json.dumps(
        {"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2}))
    result = launch(ds_job("ds-world", "--deepspeed_config", "ds_config.json",
                           code_src=str(code)), cluster3.inventory, runs_dir=tmp_path / "runs")
    assert result.ok, result.reason
    found = lines(tmp_path / "runs", "ds-world", cluster3, DS_LINE)
    assert sorted(int(f[3]) for f in found) == list(range(6)), found
    for ok, host, local, rank, world, micro, gas, total, expected in found:
        assert ok == "ok" and world == "6" and total == expected == "21"
        assert (micro, gas) == ("3", "2")
        rank_of_host = [n.name for n in cluster3.nodes].index(host)
        assert int(rank) == 2 * rank_of_host + int(local)
    node_dir = tmp_path / "runs" / "ds-world" / "nodes" / cluster3.nodes[2].name
    argv = json.loads((node_dir / "cmd.json").read_text())
    assert argv[1:4] == ["-u", "-m", "deepspeed.launcher.launch"]
    # DeepSpeed's launcher imported ahead in preflight ran the job on every node (start.warm).
    assert all((h["warm"] or {}).get("used") for h in result.hosts.values()), result.hosts
    assert "--node_rank=2" in argv and f"--master_addr={cluster3.nodes[0].ip}" in argv
    assert_no_job_left(cluster3, JOB_PROCS)


def test_a_failing_rank_under_deepspeed_stops_every_node_fast(cluster3, tmp_path):
    result = launch(ds_job("ds-fail", "--fail-rank", "3"), cluster3.inventory,
                    runs_dir=tmp_path)
    returned = time.time()
    assert result.exit_code == Exit.JOB_FAILED, result.reason
    assert_failed_fast(tmp_path / "ds-fail", cluster3, 3, "injected failure on rank 3",
                       returned, "deepspeed", JOB_PROCS)


def test_a_detached_accelerate_job_is_seen_and_stopped_with_nothing_left(cluster3, tmp_path):
    result = launch(job("acc-detach", "--steps", "1000000", detach=True), cluster3.inventory,
                    runs_dir=tmp_path)
    assert result.state == "running", result.reason
    seen = status("acc-detach", runs_dir=tmp_path)
    assert seen.state == "running" and len(seen.hosts) == 3, seen.reason
    stopped = stop("acc-detach", runs_dir=tmp_path)
    assert stopped.state == "stopped", stopped.reason
    assert_no_job_left(cluster3, JOB_PROCS)
