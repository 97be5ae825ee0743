# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The processes of the run: how many each node runs (nproc_per_node, auto resolved from its
GPUs), the backend, and whether torch on each node can run them with it."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import problem


def resolve(hosts, hostvars, plan, usable):
    """The run's GPU counts ({host: GPUs torch sees}), whether the job's auto holds on every
    node, its processes per node and its backend, as the fields of the gate's Run."""
    gpu_counts = {h: int(f["torch"].get("gpu_count") or 0) for h, f in usable.items()}
    # The job's auto on every node: a node with fewer GPUs than the others is more often a
    # broken GPU than a plan; nodes that differ on purpose set their own counts.
    auto = plan["nproc_per_node"] == "auto" and not any(
        hostvars.get(h, {}).get("torchherd_nproc_per_node") is not None for h in hosts)
    return {"gpu_counts": gpu_counts, "auto": auto,
            "nprocs": _nprocs(hosts, plan, gpu_counts, auto),
            "backend": _backend(plan["job"], gpu_counts)}


def same_gpu_count(gpu_counts):
    """With the job's auto on every node, every node has the same GPU count."""
    if len(set(gpu_counts.values())) <= 1:
        return []
    return [problem(host, "gpu count", "the same GPU count on every node "
                    "(nproc_per_node auto)", count,
                    "set nproc_per_node to a number every node has, give "
                    "nodes that differ their own torchherd_nproc_per_node, "
                    "or fix CUDA_VISIBLE_DEVICES")
            for host, count in gpu_counts.items()]


def _nprocs(hosts, plan, gpu_counts, auto):
    """{host: its processes}: its own count or the job's, auto resolved to its GPU count (1
    without GPUs); with the job's auto on every node, the smallest GPU count everywhere."""
    if auto:
        counts = set(gpu_counts.values())
        wanted = dict.fromkeys(hosts, max(min(counts) if counts else 0, 1))
    else:
        wanted = {n["host"]: n.get("nproc_per_node", plan["nproc_per_node"])
                  for n in plan.get("nodes") or []}
    nprocs = {}
    for host in hosts:
        count = wanted.get(host, plan["nproc_per_node"])
        nprocs[host] = max(gpu_counts.get(host, 0), 1) if count == "auto" else int(count or 1)
    return nprocs


def _backend(job, gpu_counts):
    """The job's backend, auto resolved: nccl where every node has a GPU, gloo otherwise."""
    backend = job.get("backend", "auto")
    if backend != "auto":
        return backend
    return "nccl" if gpu_counts and min(gpu_counts.values()) > 0 else "gloo"


def backend_available(usable, backend, gpu_counts, nprocs):
    """torch has the backend, and with nccl every process has a GPU."""
    problems = []
    for host, f in usable.items():
        t = f["torch"]
        if backend == "nccl":
            if not t.get("nccl_available"):
                problems.append(problem(host, "nccl", "torch with NCCL",
                                        f"NCCL not available (torch {t.get('version')}, "
                                        f"CUDA {t.get('cuda')})",
                                        "install a CUDA build of torch, or use backend gloo"))
            if gpu_counts[host] < nprocs[host]:
                problems.append(problem(host, "gpus", f">= {nprocs[host]} GPUs for "
                                        f"nproc_per_node {nprocs[host]} with nccl",
                                        f"{gpu_counts[host]} GPUs",
                                        "lower nproc_per_node to the GPU count (or auto), "
                                        "check CUDA_VISIBLE_DEVICES, or use backend gloo on CPU"))
        elif not t.get("gloo_available"):
            problems.append(problem(host, "gloo", "torch with gloo", "gloo not available",
                                    "install a torch build with distributed support"))
    return problems


def checks(run):
    """With the job's auto on every node, the same GPU count; then the backend available."""
    return ((same_gpu_count(run.gpu_counts) if run.auto else [])
            + backend_available(run.usable, run.backend, run.gpu_counts, run.nprocs))


CHECKS = (checks,)
