# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The gate's checks, one family of one concern a module, and this registry, which the gate
filter runs instead of naming a check.

A family's module holds what it adds, each optional, as tuples:

- NODE_CHECKS: check(host, facts, plan) on every node that answered, its problems.
- CHECKS: check(run) across the nodes (common.Run), its problems.
- NODE_WARNINGS: check(host, facts, nprocs, plan) on every node that answered, its warnings.
- NCCL_CHECKS: check(run) across the nodes of an nccl job, its problems.
- GPU_CHECKS, GPU_WARNINGS: check(host, facts, needed, plan) on every usable node of an nccl
  job, `needed` the GPUs its processes take; its problems, its warnings.
- DOWNGRADABLE: the checks (a problem's C(check)) of its problems that the job's preflight_warn
  may turn into warnings.
- NODE_ENV: env(host, facts, needed, plan) on every usable node of an nccl job, what the start
  adds to the job's environment there (the job's own env wins).

Every problem and warning is a row of common.problem. The gate lists them by kind in the order
above: node by node, each node's in the order of FAMILIES and of a family's tuple. A new family
is a module here and its place in FAMILIES; the preflight_warn choices (the plan's job spec)
name its DOWNGRADABLE checks (tests/unit/plugins/filter/test_gate_node_state.py keeps them equal).
"""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate import (
    disk,
    environment,
    gpus,
    nccl,
    network,
    procs,
    running,
    versions,
)

# In the order their problems are listed.
FAMILIES = (environment, versions, network, disk, running, procs, gpus, nccl)


def _hooks(name):
    return tuple(hook for family in FAMILIES for hook in getattr(family, name, ()))


NODE_CHECKS = _hooks("NODE_CHECKS")
CHECKS = _hooks("CHECKS")
NODE_WARNINGS = _hooks("NODE_WARNINGS")
NCCL_CHECKS = _hooks("NCCL_CHECKS")
GPU_CHECKS = _hooks("GPU_CHECKS")
GPU_WARNINGS = _hooks("GPU_WARNINGS")
DOWNGRADABLE = _hooks("DOWNGRADABLE")
NODE_ENV = _hooks("NODE_ENV")


def downgraded(problems, warnings, checks):
    """(problems, warnings) with the problems of the `checks` (the job's preflight_warn) moved
    to the warnings."""
    moved = [p for p in problems if p["check"] in checks and p["check"] in DOWNGRADABLE]
    return [p for p in problems if p not in moved], warnings + moved
