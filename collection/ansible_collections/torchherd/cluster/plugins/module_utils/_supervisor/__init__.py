# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Starting a job on one node: torchrun's command line and environment, and the detached
supervisor that runs it and writes the run directory (see _rundir) as the job goes.

Takes the torchrun_job module's parameters as they are (p). The parts: checks (whether the
job can start here), command (the launcher's command line and the job's environment), launch
(the run directory's files and the double fork), supervise (the detached supervisor: its
session and output, the launcher's start, watch and wait), meeting (the barrier and the gang
from the supervisor), standby, output (the first output and torchrun's attempts), firewall
(the start's rules removed), ending (the end written and told), nodelog (its lines in the node
log).

The module imports this package in its own process, which forks the supervisor: every part is
imported then, with the module, from the module's payload (nothing is imported after the fork,
when the payload may be gone)."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.checks import (
    StartError,
    check_start,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.command import (
    job_env,
    launcher_argv,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.launch import spawn
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.meeting import (
    barrier_seen,
    gang_formed,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.output import (
    first_output,
)

__all__ = [
    "StartError",
    "barrier_seen",
    "check_start",
    "first_output",
    "gang_formed",
    "job_env",
    "launcher_argv",
    "spawn",
]
