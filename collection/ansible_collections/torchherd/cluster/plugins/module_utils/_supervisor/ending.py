# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The supervisor's last steps, whatever ended the job: what the job leaves behind goes, then
the end is written (the run directory's exit code, the run-state record) and told to the
gang."""

from __future__ import annotations

import time

from ansible_collections.torchherd.cluster.plugins.module_utils._container import remove
from ansible_collections.torchherd.cluster.plugins.module_utils._gang import Master
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import load_json
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    hang_seen,
    note_job,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.firewall import (
    close_start_rules,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.meeting import (
    gang_formed,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.nodelog import say
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.standby import (
    standby_end,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._warm import dismiss


def finish(paths, code, running, gang, meeting, warm, close):
    """The job's end on this node with the launcher's exit `code` (127: it never started).
    `running`: what the supervisor started (see supervise)."""
    if running.get("worker_code") and code < 0:
        code = running["worker_code"]  # the launcher was ended after its worker failed
    if running.get("first_output"):
        running["first_output"].join(2)  # its last look, after the launcher's end
    code = standby_end(paths, code)
    if warm and running.get("proc") is None:
        dismiss(paths["dir"])  # nothing started here: its warm launcher goes unused
    if close is not None:
        close_start_rules(close, paths)
    _remove_container(paths)
    try:
        # A hang declared while the job ran (the `hung` file), into the record before its end,
        # also where the job ended by the gang's stop and no wait or stop here saw the file.
        hang_seen(paths)
    except OSError as exc:  # the exit code must be written whatever happens here
        say(f"the declared hang could not be written to the run's record: {exc}")
    # One write: whoever sees the exit code finds the end time too.
    note_job(paths, exit_code=code, ended_at=time.time())
    # The others hear of this end once it is on disk here; the master stays for theirs.
    if isinstance(gang, Master):
        gang.own_exit(code, meeting["name"])
        gang_formed(paths, len(gang.links), gang.expect, lost=list(gang.lost),
                    lost_at=dict(gang.lost_at))
    elif gang is not None:
        gang.own_exit(code)


def _remove_container(paths):
    """The job's container goes with the job (the runtime removes it on its own unless its
    processes were killed from outside)."""
    found = load_json(paths["meta"], {}).get("container")
    if found:
        said = remove(found, found["name"])
        if said:
            say(f"container {found['name']} could not be removed: {said}")
