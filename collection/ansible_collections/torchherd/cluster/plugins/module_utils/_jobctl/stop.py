# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The torchrun_job module's state=stopped: end the job on this node, or the launcher that
preflight started ahead for a run that never started here."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.report import report
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    job_pids,
    read_state,
    recorded_job,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import hang_seen
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record
from ansible_collections.torchherd.cluster.plugins.module_utils._stop import stop as stop_job
from ansible_collections.torchherd.cluster.plugins.module_utils._warm import dismiss


def stop(module, p, paths):
    """Stop the job here (SIGTERM, the grace, SIGKILL): the result's fields."""
    state = read_state(paths)
    left = job_pids(paths["dir"])
    if state["state"] != "running" and not left:
        return report(paths, killed=[])
    if module.check_mode:
        return report(paths, changed=True, killed=[])
    if state["state"] == "absent" and recorded_job(paths["dir"]).get("started_at") is None:
        # The run did not start here (no run directory, or one that holds no start: the
        # firewall role's record of its rules): what carries its marker is the launcher
        # preflight started ahead (_warm), which goes now.
        return report(paths, changed=True, killed=dismiss(paths["dir"]))
    # A hang declared here (job_stacks' mark_hung, just before the stop that ends the hung job)
    # that no wait has seen since: the record has it before the job's end.
    hang_seen(paths)
    killed = stop_job(paths, state["pid"], p["grace"])
    record(paths, "job", killed=killed)
    return report(paths, changed=True, killed=killed)
