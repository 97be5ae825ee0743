# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""DeepSpeed's per-node launcher, started by torchherd on every node instead of DeepSpeed's own
runner (no pdsh fan-out)."""

from __future__ import annotations

import base64
import json

from ansible_collections.torchherd.cluster.plugins.module_utils._launchers.common import (
    static_rendezvous,
)

NAME = "deepspeed"
DISTRIBUTION = "deepspeed"
PACKAGE = 'deepspeed'
FIX = ("install the same deepspeed on every node (pip install deepspeed==<version> in the "
       "job's venv)")
# Its launcher imports torch through deepspeed: a warm launcher (_warm) imports it ahead (it runs
# unbuffered, as -u has it).
WARM_MODULE = "deepspeed.launcher.launch"
PLANNED_OPTIONS = frozenset({
    "--world_info", "--node_rank", "--master_addr", "--master_port", "--nnodes",
    "--nproc_per_node"})


def constraints(job, nprocs):
    return static_rendezvous(NAME, job)


def argv(p, paths, python):
    # The per-node launcher that DeepSpeed's own runner starts on each host over pdsh; the world
    # is described as it would: every node in node-rank order with its local ranks.
    counts = p["node_nprocs"] or [p["nproc_per_node"]] * int(p["nnodes"])
    world = {f"node{i}": list(range(count)) for i, count in enumerate(counts)}
    info = base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
    return [python, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={info}",
            f"--node_rank={p['node_rank']}", f"--master_addr={p['master_addr']}",
            f"--master_port={p['master_port']}"]


def env(p):
    return {}


def rank_logs(p):
    # Its per-node launcher prints every rank's output on its own: no per-rank files.
    return False
