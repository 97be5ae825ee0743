# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The start's firewall rules, removed by the supervisor once the job has ended here."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import (
    ProcessRunner,
    close_rules,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import rules_closed
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.nodelog import say


def close_start_rules(close, paths):
    """The start's firewall rules, removed with the firewall's own code before the exit code
    is written: whoever sees the job ended here finds the rules gone (or the error)."""
    try:
        options = {k: v for k, v in close.items() if k != "run_id"}
        closed = close_rules(ProcessRunner(say), close["run_id"], options)
    except Exception as exc:  # the exit code must be written whatever happens here
        closed = {"changed": False, "error": f"{type(exc).__name__}: {exc}"}
    if "error" in closed:
        say(f"the rules of run {close['run_id']} could not be removed here: {closed['error']}")
    record(paths, "firewall", **rules_closed("supervisor", closed))
