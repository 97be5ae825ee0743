# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Whether the job can start on this node, and the run directory of an earlier try kept
aside for a restart."""

from __future__ import annotations

import os
import shutil

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import read_state
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    carry_over,
    read_record,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._starterror import StartError


def keep_ended_run(p, paths, state):
    """A restart (p["restart"] > 0) of a run that ended here: its run directory's files move
    to restarts/<n> inside it (n: the restart that ended it, 0 for the first launch), so that
    the job starts again in a fresh one and nothing of the earlier try is lost."""
    if not p.get("restart") or state in ("absent", "running"):
        return False
    run_dir = paths["dir"]
    kept = os.path.join(run_dir, "restarts")
    number = p["restart"] - 1
    while os.path.exists(os.path.join(kept, str(number))):
        number += 1
    staging = f"{run_dir}.restart-{os.getpid()}"
    os.rename(run_dir, staging)
    os.makedirs(kept, mode=0o755)
    earlier = os.path.join(staging, "restarts")
    if os.path.isdir(earlier):
        for name in os.listdir(earlier):
            os.rename(os.path.join(earlier, name), os.path.join(kept, name))
        os.rmdir(earlier)
    os.rename(staging, os.path.join(kept, str(number)))
    carry_over(paths, read_record({"dir": os.path.join(kept, str(number))}))
    return True


def check_start(p, paths):
    """Raises StartError unless the job can start here."""
    current = read_state(paths)
    if keep_ended_run(p, paths, current["state"]):
        current = read_state(paths)
    if current["state"] != "absent":
        raise StartError(
            f"run {p['run_id']} already exists on this node (state {current['state']}, "
            f"run dir {paths['dir']}); a run id starts once: stop it or choose another run id",
            job_state=current["state"], run_dir=paths["dir"])
    if not p["script"]:
        raise StartError("script is required with state=started")
    if p["wrapper"] and not shutil.which(p["wrapper"][0]):
        raise StartError(f"wrapper: expected {p['wrapper'][0]} on this node's PATH, found "
                         f"none; fix: install it, or give its absolute path")
