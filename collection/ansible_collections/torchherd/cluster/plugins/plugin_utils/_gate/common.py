# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What every check family of the gate shares: the problem row the gate's table lists, and the
run the families' checks across nodes read."""

from __future__ import annotations

from dataclasses import dataclass

# The end of the fix of a refusal that the job's preflight_warn may turn into a warning.
PREFLIGHT_WARN_FIX = "; or, to start anyway, add '{check}' to the job's preflight_warn"


def problem(host, check, expected, found, fix):
    """One problem (or warning): the host, the check, what was expected, what was found and the
    fix."""
    return {"host": host, "check": check, "expected": str(expected), "found": str(found),
            "fix": fix}


def mib(count):
    return f"{count >> 20} MiB"


@dataclass(frozen=True)
class Run:
    """The run as the checks across nodes see it: its hosts in rank order, hostvars, the plan
    and the comparison's keys (the filter's match), the facts of the nodes that answered and of
    those whose interpreter imports torch (usable), the job's launcher (_launchers), and what
    the gate resolved from the facts (plugin_utils/_gate/procs)."""

    hosts: list
    hostvars: dict
    plan: dict
    match: list | None
    facts: dict
    usable: dict
    launcher: object
    gpu_counts: dict
    auto: bool
    nprocs: dict
    backend: str

    def needed(self, host):
        """The GPUs a usable node's processes take: local rank i uses the i-th one it sees."""
        return (self.usable[host]["torch"].get("gpus") or [])[:self.nprocs[host]]
