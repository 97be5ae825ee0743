# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""torchrun (torch.distributed.run): the default launcher, and the one with elastic rendezvous."""

from __future__ import annotations

NAME = "torchrun"
# Part of torch, which the gate checks on its own.
DISTRIBUTION = None
PACKAGE = None
FIX = None
# The module it runs with -m, which the warm launcher (_warm) imports ahead: torch.
WARM_MODULE = "torch.distributed.run"
PLANNED_OPTIONS = frozenset({
    "--nnodes", "--nproc-per-node", "--nproc_per_node", "--node-rank", "--node_rank",
    "--master-addr", "--master_addr", "--master-port", "--master_port",
    "--rdzv-backend", "--rdzv_backend", "--rdzv-endpoint", "--rdzv_endpoint",
    "--rdzv-id", "--rdzv_id", "--log-dir", "--log_dir", "--redirects", "--tee",
    "--max-restarts", "--max_restarts", "--standalone"})


def constraints(job, nprocs):
    return []


def argv(p, paths, python):
    argv = [python, "-m", "torch.distributed.run",
            "--nnodes", p["nnodes"], "--nproc-per-node", str(p["nproc_per_node"]),
            "--max-restarts", str(p["max_restarts"]),
            # Per-rank stdout/stderr files plus a copy on torchrun's output, prefixed by rank.
            "--log-dir", paths["torchrun_logs"], "--redirects", "3", "--tee", "3"]
    if p["rdzv"] == "c10d":
        argv += ["--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"{p['master_addr']}:{p['master_port']}",
                 "--rdzv-id", p["run_id"]]
        if p["rdzv_conf"]:
            argv += ["--rdzv-conf",
                     ",".join(f"{k}={v}" for k, v in sorted(p["rdzv_conf"].items()))]
    else:
        argv += ["--node-rank", str(p["node_rank"]),
                 "--master-addr", p["master_addr"], "--master-port", str(p["master_port"])]
    return argv


def env(p):
    return {}


def rank_logs(p):
    return True
