"""node_runs' parts: what ps says of a run from its record and its processes, the GPUs a run
holds and the GPU processes that are no run's (nvidia-smi's answers as recorded on a node of
H100s), and a run of a container on the same machine left to that container's node."""

from __future__ import annotations

import getpass
import json
import os

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils._gpus import (
    parse_apps,
    parse_smi,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._noderuns import (
    describe,
    elsewhere,
    foreign,
    gpu_index,
    held,
    node_runs,
    ps_state,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._proc import proc_start_time
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import note_job

# nvidia-smi --query-gpu=... (SMI_ARGS) and --query-compute-apps=... (APPS_ARGS) on two H100s:
# a rank of a torchherd run on each, and another user's notebook on the second (a pid above
# Linux's largest: a process in another pid namespace, which no /proc here shows).
SMI = ("0, GPU-5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d, NVIDIA H100 80GB HBM3, 81559, 570.124.06, "
       "Enabled, Default, 9.0, Disabled, 0, No, No, 00000000:18:00.0\n"
       "1, GPU-9e1b2c3d-4f5a-6b7c-8d9e-0f1a2b3c4d5e, NVIDIA H100 80GB HBM3, 81559, 570.124.06, "
       "Enabled, Default, 9.0, Disabled, 0, No, No, 00000000:2A:00.0\n")
APPS = ("GPU-5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d, {rank0}, 30522, /opt/venv/bin/python3\n"
        "GPU-9e1b2c3d-4f5a-6b7c-8d9e-0f1a2b3c4d5e, {rank1}, 30522, /opt/venv/bin/python3\n"
        "GPU-9e1b2c3d-4f5a-6b7c-8d9e-0f1a2b3c4d5e, 4194399, 2048, python3 -m jupyter, lab\n")
MIB = 1024 * 1024


def driver_answer(rank0, rank1):
    """_gpus.read_gpus' answer from the recorded text, the ranks' pids filled in."""
    gpus, driver = parse_smi(SMI)
    return {"gpus": gpus, "driver": driver, "source": "nvidia-smi",
            "processes": parse_apps(APPS.format(rank0=rank0, rank1=rank1))}


@pytest.mark.parametrize("job_state,supervisor,has_dir,said", [
    ("running", True, True, "running"),
    ("running", None, True, "running"),   # a record of an earlier version: no supervisor named
    ("running", False, True, "stale"),    # its supervisor died: nobody watches the launcher
    ("stopped", True, True, "stale"),     # processes outlived the stop
    ("failed", False, True, "stale"),
    ("lost", False, True, "stale"),
    ("absent", None, True, "starting"),   # a launcher started ahead, before the start
    ("absent", None, False, "stale"),     # its run directory went while it runs
])
def test_what_ps_says_of_a_run_with_live_processes(job_state, supervisor, has_dir, said):
    assert ps_state(job_state, supervisor, has_dir) == said


def test_the_gpus_a_runs_processes_hold_and_the_others():
    answer = driver_answer(4242, 4243)
    index = gpu_index(answer["gpus"])
    assert index == {"5d6c7f6a-8a3e-2b1f-9c4d-1e2f3a4b5c6d": 0,
                     "9e1b2c3d-4f5a-6b7c-8d9e-0f1a2b3c4d5e": 1}
    assert held(answer["processes"], {4242, 4243, 4244}, index) == ([0, 1], 2 * 30522 * MIB)
    assert held(answer["processes"], {5000}, index) == ([], None)
    others = foreign(answer["processes"], {4242, 4243}, index, user_of=lambda pid: "bob")
    # The process name keeps its comma (nvidia-smi does not quote it).
    assert others == [{"pid": 4194399, "user": "bob", "gpu": 1, "used_memory_bytes": 2048 * MIB,
                       "name": "python3 -m jupyter, lab"}]
    # No nvidia-smi: nothing to say, not "none".
    assert foreign(None, set(), {}) is None


def a_run(root, run_id, **job):
    run_dir = os.path.join(str(root), "runs", run_id)
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "meta.json"), "w", encoding="utf-8") as handle:
        json.dump({"host": "gpu01", "node_rank": 2, "name": "train"}, handle)
    note_job({"dir": run_dir}, **job)
    return run_dir


def this_process():
    return {"pid": os.getpid(), "start": proc_start_time(os.getpid())}


def test_a_run_is_described_from_its_record_and_its_processes(tmp_path):
    # This test's process stands in for the supervisor and the launcher: alive.
    run_dir = a_run(tmp_path, "r1", started_at=1795860900.5, supervisor=this_process(),
                    launcher=this_process(), pid=os.getpid())
    run = describe(run_dir, [os.getpid()], driver_answer(os.getpid(), 1)["processes"],
                   gpu_index(parse_smi(SMI)[0]))
    assert run == {"run_id": "r1", "run_dir": run_dir, "name": "train", "host": "gpu01",
                   "node_rank": 2, "user": getpass.getuser(), "started_at": 1795860900.5,
                   "state": "running", "job_state": "running", "exit_code": None,
                   "pids": [os.getpid()], "gpus": [0], "gpu_memory_bytes": 30522 * MIB}
    # Without nvidia-smi the GPUs held are unknown, not none.
    assert describe(run_dir, [os.getpid()])["gpus"] is None


def test_processes_that_outlived_their_runs_end_are_stale(tmp_path):
    run_dir = a_run(tmp_path, "r2", started_at=1.0, supervisor=this_process(),
                    launcher=this_process(), pid=os.getpid(), stopped_at=2.0, exit_code=-15,
                    ended_at=3.0)
    run = describe(run_dir, [os.getpid()])
    assert (run["state"], run["job_state"], run["exit_code"]) == ("stale", "stopped", -15)


def test_the_node_scan_leaves_out_gone_processes_and_lists_foreign_gpu_users(tmp_path):
    run_dir = a_run(tmp_path, "r3", started_at=1.0, supervisor=this_process(),
                    launcher=this_process(), pid=os.getpid())
    gone = a_run(tmp_path, "r4", started_at=1.0)
    found = node_runs(found={run_dir: [os.getpid()], gone: [2 ** 22 + 1]},
                      driver=driver_answer(os.getpid(), 1))
    assert [r["run_id"] for r in found["runs"]] == ["r3"]
    assert found["runs"][0]["gpus"] == [0]
    # pid 1 (the init of this machine or container) holds the second GPU here.
    assert [(p["pid"], p["gpu"]) for p in found["gpu_processes"]] == [(1, 1), (4194399, 1)]
    assert found["gpu_processes"][1]["user"] is None
    assert found["sees_all"] == (os.geteuid() == 0)
    # A node without GPUs: no GPU processes to tell of.
    assert node_runs(found={}, driver={})["gpu_processes"] is None


def test_a_run_of_a_container_on_this_machine_is_that_containers_nodes(tmp_path):
    spaces = {"self": "mnt:[1]", 10: "mnt:[2]", 11: "mnt:[2]", 12: "mnt:[1]", 13: None}
    there = str(tmp_path / "runs" / "r5")
    os.makedirs(there)
    missing = "/nowhere/runs/r6"
    assert elsewhere(missing, [10, 11], spaces.get)
    # In this node's namespace, or unknown: its run directory went, the run is still here.
    assert not elsewhere(missing, [10, 12], spaces.get)
    assert not elsewhere(missing, [13], spaces.get)
    # A run directory here: this node's run (a launcher in a container of its own too).
    assert not elsewhere(there, [10], spaces.get)
