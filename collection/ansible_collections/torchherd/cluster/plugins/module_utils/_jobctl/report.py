# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The job's state on this node as the torchrun_job module returns it, for every state of the
module (state=status is this alone)."""

from __future__ import annotations

import os
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    last_line,
    load_json,
    read_state,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import read_record


def report(paths, changed=False, **extra):
    """The job's state here, for every state of the module: the result's fields."""
    state = read_state(paths)
    meta = load_json(paths["meta"], {})
    if state["exit_code"] is not None and not meta.get("ended_at"):
        # An exit code written by stop for a supervisor that never finished.
        try:
            meta["ended_at"] = os.path.getmtime(paths["exit_code"])
        except OSError:
            pass
    return dict(changed=changed, job_state=state["state"], pid=state["pid"],
                exit_code=state["exit_code"], run_dir=paths["dir"], log=paths["log"],
                last_line=last_line(paths["log"]), meta=meta,
                started_at=meta.get("started_at"), ended_at=meta.get("ended_at"),
                checked_at=time.time(), record=read_record(paths), **extra)
