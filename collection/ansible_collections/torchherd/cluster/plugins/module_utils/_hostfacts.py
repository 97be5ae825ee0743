# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What NCCL relies on from the host, read from /proc and /sys in microseconds: the identity it
gives the host, the shared memory its processes exchange through, the memory the user may lock
for RDMA, and the InfiniBand/RoCE ports. Runs on the nodes (Python 3.8 and later)."""

from __future__ import annotations

import os
import resource

# NCCL tells hosts apart by the hash of the host name and this (NCCL_HOSTID replaces both).
BOOT_ID = "/proc/sys/kernel/random/boot_id"
SHM = "/dev/shm"
INFINIBAND = "/sys/class/infiniband"


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def boot_id(path=BOOT_ID):
    return _read(path) or None


def shm_bytes(path=SHM):
    """The size of /dev/shm (the tmpfs NCCL's and DataLoader workers' shared memory lives in);
    None where there is none."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def memlock():
    """RLIMIT_MEMLOCK (ulimit -l) of this process, which the job inherits: "unlimited" or
    bytes. RDMA registers (locks) the buffers NCCL sends from."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else soft


def parse_port_state(text):
    """"4: ACTIVE" -> "ACTIVE" (the state file of one port)."""
    return (text or "").partition(":")[2].strip() or (text or "").strip() or None


def infiniband(path=INFINIBAND):
    """{device: {port: {state, link_layer}}} of the node's InfiniBand/RoCE devices (mlx5_0:
    {"1": {"state": "ACTIVE", "link_layer": "InfiniBand"}}); empty without any."""
    try:
        devices = sorted(os.listdir(path))
    except OSError:
        return {}
    found = {}
    for device in devices:
        ports_dir = os.path.join(path, device, "ports")
        try:
            ports = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
        except OSError:
            continue
        found[device] = {port: {
            "state": parse_port_state(_read(os.path.join(ports_dir, port, "state"))),
            "link_layer": _read(os.path.join(ports_dir, port, "link_layer"))} for port in ports}
    return found


def host_facts():
    """The facts above, as node_facts returns them."""
    return {"boot_id": boot_id(), "shm_bytes": shm_bytes(), "memlock": memlock(),
            "infiniband": infiniband()}
