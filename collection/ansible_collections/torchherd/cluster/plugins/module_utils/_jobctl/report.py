# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The job's state on this node as the torchrun_job module returns it, for every state of the
module (state=status is this alone)."""

from __future__ import annotations

import time

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    last_line,
    load_json,
    read_state,
    recorded_job,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import read_record
from ansible_collections.torchherd.cluster.plugins.module_utils._use import brief


def report(paths, changed=False, **extra):
    """The job's state here, for every state of the module: the result's fields."""
    state = read_state(paths)
    # The answer's meta: the run's description with the record's times, as the node kept
    # them in meta.json before the record held them.
    job = recorded_job(paths["dir"])
    meta = load_json(paths["meta"], {})
    meta.update({key: job[key] for key in ("started_at", "ended_at")
                 if job.get(key) is not None})
    return dict(changed=changed, job_state=state["state"], pid=state["pid"],
                exit_code=state["exit_code"], run_dir=paths["dir"], log=paths["log"],
                last_line=last_line(paths["log"]), meta=meta,
                started_at=meta.get("started_at"), ended_at=meta.get("ended_at"),
                checked_at=time.time(), record=_answered(read_record(paths)), **extra)


def _answered(record):
    """The record as the answer carries it: the samples' points stay on the node (collect
    brings them back), their recent ones and stats come (_use.brief)."""
    if record.get("use"):
        record = dict(record, use=brief(record["use"]))
    return record
