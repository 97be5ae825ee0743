# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""accelerate launch in multi-process mode, with the static rendezvous of the plan."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._launchers.common import (
    static_rendezvous,
)

NAME = "accelerate"
DISTRIBUTION = "accelerate"
PACKAGE = 'accelerate'
FIX = ("install the same accelerate on every node (pip install accelerate==<version> in the "
       "job's venv)")
# accelerate's launch imports torch (and in multi-process mode runs torch.distributed.run in its
# own process): a warm launcher (_warm) imports it ahead.
WARM_MODULE = "accelerate.commands.launch"
PLANNED_OPTIONS = frozenset({
    "--num_machines", "--num_processes", "--machine_rank", "--main_process_ip",
    "--main_process_port", "--multi_gpu", "--cpu", "--same_network", "--rdzv_backend",
    "--log_dir", "--tee", "-t", "--max_restarts"})


def constraints(job, nprocs):
    problems = static_rendezvous(NAME, job)
    if len({n for n in nprocs.values() if n is not None}) > 1:
        problems.append(f"torchherd_nproc_per_node: expected the same count on every node with "
                        f"launcher accelerate (it gives every machine num_processes / "
                        f"num_machines), found {', '.join(f'{n}={c}' for n, c in nprocs.items())};"
                        f" fix: the same count everywhere, or launcher torchrun or deepspeed")
    return problems


def argv(p, paths, python):
    # accelerate's multi-process launcher calls torch.distributed.run in its own process (GPU
    # or, with ACCELERATE_USE_CPU=1 from env(), CPU with gloo); --same_network gives it the
    # static rendezvous with this node's rank. --num_processes counts every node's processes.
    nnodes = int(p["nnodes"])
    total = nnodes * p["nproc_per_node"]
    argv = [python, "-m", "accelerate.commands.launch"]
    if total > 1:
        argv += ["--multi_gpu", "--same_network", "--num_machines", str(nnodes),
                 "--machine_rank", str(p["node_rank"]), "--num_processes", str(total),
                 "--main_process_ip", p["master_addr"]]
    else:
        # One process in all: accelerate refuses --multi_gpu ("at least 2 processes") and runs
        # the script itself, as its own child. A config file of the user's that asks for
        # multi-GPU still gets torch.distributed.run, with the options below.
        argv += ["--num_machines", "1", "--num_processes", "1"]
    return argv + ["--main_process_port", str(p["master_port"]),
                   "--max_restarts", str(p["max_restarts"]),
                   "--log_dir", paths["torchrun_logs"], "--tee", "3"]


def rank_logs(p):
    # Its simple launcher (one process in all) runs the script itself: no per-rank files.
    return int(p["nnodes"]) * p["nproc_per_node"] > 1


def env(p):
    # Without it accelerate's multi-process mode on a node without GPUs starts every process as
    # a world of one, silently.
    return {"ACCELERATE_USE_CPU": "1"} if p["use_cpu"] else {}
