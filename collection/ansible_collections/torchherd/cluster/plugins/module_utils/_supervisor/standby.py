# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A node that starts as a standby (meta's standby, where torchrun restarts the job itself):
its launcher joins torchrun's rendezvous after a delay, and its end without workers is no
failure."""

from __future__ import annotations

import os
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    load_json,
    stop_asked,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import note_job
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.nodelog import say


def wait_standby(paths):
    """The standby's delay before its launcher starts; False where the job was stopped
    meanwhile (True at once for a node that is no standby)."""
    standby = load_json(paths["meta"], {}).get("standby")
    if not (standby and standby["delay"] > 0):
        return True
    say(f"standby: the launcher starts in {standby['delay']:g} s, once the job's nodes "
        f"have joined torchrun's rendezvous; it waits there for a node the job loses")
    until = time.monotonic() + standby["delay"]
    while time.monotonic() < until and not stop_asked(paths):
        time.sleep(0.1)
    return not stop_asked(paths)


def workers_started(torchrun_logs):
    """Whether torchrun started workers here: it makes an attempt_<n> directory for their
    logs each time it starts them, after its rendezvous."""
    return any(name.startswith("attempt_") for _top, dirs, _files in os.walk(torchrun_logs)
               for name in dirs)


def standby_end(paths, code):
    """The exit code the node reports, for a job whose restarts are torchrun's (meta's
    standby). A node whose launcher ended without ever starting workers waited in torchrun's
    rendezvous as a standby the job did not need: torchrun ends it with an error once the
    rendezvous closes or its master is gone. That end is recorded (the record's
    job.standby with the launcher's own code, and standby_unneeded_at) and reported as 0: no
    failure for the gang or the summary. A stopped node stays stopped."""
    meta = load_json(paths["meta"], {})
    if meta.get("standby") is None or stop_asked(paths):
        return code
    used = workers_started(paths["torchrun_logs"])
    said = {"standby": {"used": used, "launcher_exit": code}}
    if not (used or code == 0):
        say(f"standby: not needed (the launcher ended with exit code {code} without starting "
            f"workers: the job's rendezvous closed)")
        said["standby_unneeded_at"] = time.time()
    note_job(paths, **said)
    return code if "standby_unneeded_at" not in said else 0
