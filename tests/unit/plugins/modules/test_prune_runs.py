"""prune_runs on real run directories: an ended run goes (check mode: only said), a running
one stays, a missing one is said missing."""

from __future__ import annotations

import os

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic
from ansible_collections.torchherd.cluster.plugins.module_utils._proc import proc_start_time
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import run_paths
from ansible_collections.torchherd.cluster.plugins.modules.prune_runs import prune_one


def ended(root, run_id):
    paths = run_paths(str(root), run_id)
    os.makedirs(paths["torchrun_logs"])
    write_atomic(paths["pid"], "1 1")
    write_atomic(paths["exit_code"], "0\n")
    write_atomic(paths["log"], "x" * 100)
    return paths


def test_an_ended_run_is_removed_and_measured(tmp_path):
    paths = ended(tmp_path, "r1")
    checked = prune_one(str(tmp_path), "r1", check_mode=True)
    assert checked["state"] == "succeeded" and checked["removed"]
    assert checked["files"] == 3 and checked["bytes"] == len("1 1") + len("0\n") + 100
    assert os.path.isdir(paths["dir"])  # check mode removes nothing
    done = prune_one(str(tmp_path), "r1", check_mode=False)
    assert done == dict(checked, error=None) and not os.path.exists(paths["dir"])
    assert prune_one(str(tmp_path), "r1", check_mode=False)["state"] == "missing"


def test_a_running_run_stays(tmp_path):
    paths = run_paths(str(tmp_path), "r2")
    os.makedirs(paths["dir"])
    # This test's own process stands in for torchrun: alive, with its start time.
    write_atomic(paths["pid"], f"{os.getpid()} {proc_start_time(os.getpid())}")
    found = prune_one(str(tmp_path), "r2", check_mode=False)
    assert found["state"] == "running" and not found["removed"]
    assert os.path.isdir(paths["dir"])
