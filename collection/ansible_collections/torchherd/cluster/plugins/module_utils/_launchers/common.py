# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What several launchers share."""

from __future__ import annotations


def static_rendezvous(name, job):
    """The plan's problem where a launcher without elastic rendezvous gets rdzv c10d."""
    if job["rdzv"] == "static":
        return []
    return [f"job.rdzv: expected static with launcher {name} (elastic rendezvous is torchrun's), "
            f"found {job['rdzv']!r}; fix: rdzv static, or launcher torchrun"]
