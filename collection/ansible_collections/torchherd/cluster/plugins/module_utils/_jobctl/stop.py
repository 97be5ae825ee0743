# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The torchrun_job module's state=stopped: end the job on this node, or the launcher that
preflight started ahead for a run that never started here."""

from __future__ import annotations

import os

from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.report import report
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    job_pids,
    read_state,
)
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
    if state["state"] == "absent" and not os.path.isdir(paths["dir"]):
        # The run did not start here: what carries its marker is the launcher preflight
        # started ahead (_warm), which goes now.
        return report(paths, changed=True, killed=dismiss(paths["dir"]))
    killed = stop_job(paths, state["pid"], p["grace"])
    record(paths, "job", killed=killed)
    return report(paths, changed=True, killed=killed)
