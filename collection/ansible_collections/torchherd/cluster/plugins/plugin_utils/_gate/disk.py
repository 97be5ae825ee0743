# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The room a node gives the run: free space at its torchherd root, and a /dev/shm large enough
for the processes it runs."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import mib, problem

MIN_FREE_BYTES = 1 << 30
MIN_SHM_BYTES = 1 << 30


def _fmt_bytes(count):
    return f"{count / (1 << 30):.1f} GiB"


def disk(host, f, plan):
    if f.get("disk_free_bytes", MIN_FREE_BYTES) >= MIN_FREE_BYTES:
        return []
    return [problem(host, "disk", f">= {_fmt_bytes(MIN_FREE_BYTES)} free at {f.get('root')}",
                    _fmt_bytes(f["disk_free_bytes"]),
                    "free space (the venvs of old locks under " + str(f.get("root"))
                    + "/venvs are not removed by torchherd: remove those no job uses) or "
                    "point torchherd_root elsewhere")]


def shm_size(host, f, nprocs, plan):
    """/dev/shm holds NCCL's buffers between a node's processes and DataLoader workers'
    batches: a container's default (64 MB) fails them with a bus error or 'No space left'."""
    size = f.get("shm_bytes")
    if nprocs < 2 or size is None or size >= MIN_SHM_BYTES:
        return []
    return [problem(host, "shm", f">= {_fmt_bytes(MIN_SHM_BYTES)} of /dev/shm for "
                    f"{nprocs} processes", mib(size),
                    "give the node (container) a larger /dev/shm: podman/docker run "
                    "--shm-size=8g, or mount -o remount,size=8G /dev/shm as root")]


# The checks of one node's own facts, in the order their problems are listed.
NODE_CHECKS = (disk,)
# The warnings of one node's own facts, every backend.
NODE_WARNINGS = (shm_size,)
