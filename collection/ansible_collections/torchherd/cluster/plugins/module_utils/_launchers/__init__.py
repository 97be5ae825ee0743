# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The launchers a job can start with: one module each holding everything particular to it,
and this registry, which the plan, the gate, node_facts and the supervisor ask instead of naming
a launcher.

A launcher's module holds:

- NAME: the job's C(launcher) value.
- DISTRIBUTION: the Python distribution the job's interpreter needs for it (node_facts reads its
  version, the gate wants it installed and equal everywhere); None where torch brings it.
- PACKAGE: the package the job's interpreter imports for it (node_facts looks for it before it
  reads DISTRIBUTION's version); None where torch brings it.
- FIX: the fix when nodes have different versions of DISTRIBUTION (None without one).
- WARM_MODULE: the module its command line runs with ``-m``, where a warm launcher (_warm) may
  import it ahead, in preflight; None where it may not.
- PLANNED_OPTIONS: its options that torchherd sets from the plan, refused in launcher_args.
- constraints(job, nprocs): what it refuses in a plan (the coerced job, each node's process
  count), as the plan's problem strings.
- argv(p, paths, python): its command line on this node, from the torchrun_job module's
  parameters, the run's paths and the job's interpreter.
- env(p): the environment it needs besides its command line.
- rank_logs(p): whether its ranks write their own log files under the run's torchrun_logs
  (the supervisor's time to first output looks there; else at the node log's growth).

Its ranks are found as every launcher's are (LOCAL_RANK in their environment, see _supervisor).
A new launcher is a module here, listed below, and its name in the launcher choices that YAML
and the module's argument spec hold: roles/plan/meta/argument_specs.yml and the torchrun_job
module (tests/unit/plugins/module_utils/test_launchers.py keeps the documented ones equal to
LAUNCHERS).

Runs on the nodes (Python 3.8 and later) and in the controller's filters.
"""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import (
    accelerate,
    deepspeed,
    torchrun,
)

# In the order of the launcher choices.
LAUNCHERS = {launcher.NAME: launcher for launcher in (torchrun, accelerate, deepspeed)}


def distributions():
    """{launcher name: its distribution} of the launchers that torch does not bring."""
    return {name: launcher.DISTRIBUTION for name, launcher in LAUNCHERS.items()
            if launcher.DISTRIBUTION}


def packages():
    """{launcher name: the package it imports} of the launchers that torch does not bring."""
    return {name: launcher.PACKAGE for name, launcher in LAUNCHERS.items() if launcher.PACKAGE}
