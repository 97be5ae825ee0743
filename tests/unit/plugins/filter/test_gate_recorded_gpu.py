"""The preflight gate on node facts recorded on a real GPU machine.

fixtures/h100_node_facts.json is what torchherd.cluster.node_facts returned, unchanged, on one
NVIDIA H100 80GB HBM3 (driver 580.159.04, Ubuntu 24.04, Python 3.12.3, torch 2.11.0+cu130,
NCCL 2.28.9), run as
``ansible localhost -c local -m torchherd.cluster.node_facts -a 'python=python3 root=/tmp/th
port=29500'``. torch reports the GPU's UUID without nvidia-smi's ``GPU-`` prefix. That machine
had no iproute2 (addresses fell back to the resolver) and a carried rsync (/tmp/rs/bin/rsync).
"""

import copy
import json
from pathlib import Path

import pytest
from test_gate import checks, make

from ansible_collections.torchherd.cluster.plugins.filter.gate import gate

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "h100_node_facts.json"


@pytest.fixture
def h100():
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def two(facts):
    """Two inventory entries on the one machine: both see its GPU."""
    return {"node0": facts, "node1": copy.deepcopy(facts)}


def test_fixture_is_a_one_gpu_cuda_node(h100):
    # What the cases below rely on: one GPU with a UUID, CUDA torch with NCCL, no error.
    torch = h100["torch"]
    assert torch["error"] is None and h100["python"]["error"] is None
    assert torch["cuda_available"] is True and torch["nccl_available"] is True
    assert torch["gpu_count"] == 1 and len(torch["gpus"]) == 1
    assert torch["gpus"][0]["uuid"] and torch["gpus"][0]["name"].startswith("NVIDIA H100")
    assert torch["version"].endswith("+cu130") and torch["cuda"] == "13.0"
    assert torch["nccl"] == "2.28.9"


def test_one_node_nccl_auto_resolves_to_one_process_and_passes(h100):
    verdict = gate(*make({"node0": h100}, backend="nccl", nproc_per_node="auto"))
    assert verdict["ok"], verdict["table"]
    assert verdict["problems"] == []
    assert verdict["nproc_per_node"] == 1 and verdict["world_size"] == 1
    assert verdict["backend"] == "nccl"
    row = verdict["table"].splitlines()[1].split()
    assert row == ["node0", h100["hostname"], "3.12.3", "2.11.0+cu130", "13.0", "2.28.9", "1", "1",
                   "-"]


def test_one_node_backend_auto_picks_nccl(h100):
    verdict = gate(*make({"node0": h100}))
    assert verdict["ok"], verdict["table"]
    assert verdict["backend"] == "nccl" and verdict["nproc_per_node"] == 1


def test_two_entries_seeing_the_same_gpu_fail_with_duplicate_gpu(h100):
    verdict = gate(*make(two(h100), backend="nccl", nproc_per_node="auto"))
    assert not verdict["ok"]
    assert checks(verdict) == [("node0, node1", "duplicate gpu")]
    problem = verdict["problems"][0]
    # Named as nvidia-smi -L names it, so the user can find it there.
    assert problem["found"] == f"GPU-{h100['torch']['gpus'][0]['uuid']} seen by all of them"
    assert "CUDA_VISIBLE_DEVICES" in problem["fix"]
    # The entries agree on everything else: the duplicate is the only finding.
    assert verdict["nproc_per_node"] == 1 and verdict["world_size"] == 2


def test_two_entries_with_nproc_one_fail_the_same_way(h100):
    # The launch of inventories/local.ini on the GPU machine (--nproc-per-node 1).
    verdict = gate(*make(two(h100), backend="nccl", nproc_per_node=1))
    assert checks(verdict) == [("node0, node1", "duplicate gpu")]


def test_nproc_two_with_nccl_on_the_one_gpu_node_fails_naming_it(h100):
    verdict = gate(*make({"node0": h100}, backend="nccl", nproc_per_node=2))
    assert not verdict["ok"]
    assert checks(verdict) == [("node0", "gpus")]
    problem = verdict["problems"][0]
    assert problem["found"] == "1 GPUs"
    assert problem["expected"].startswith(">= 2 GPUs")
