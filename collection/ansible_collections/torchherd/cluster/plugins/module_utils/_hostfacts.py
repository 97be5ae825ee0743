# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What NCCL relies on from the host, read from /proc and /sys in microseconds: the identity it
gives the host, the shared memory its processes exchange through, the memory the user may lock
for RDMA, the InfiniBand/RoCE ports, and which of those sit near which GPU on the PCI tree.
Runs on the nodes (Python 3.8 and later)."""

from __future__ import annotations

import os
import resource

# NCCL tells hosts apart by the hash of the host name and this (NCCL_HOSTID replaces both).
BOOT_ID = "/proc/sys/kernel/random/boot_id"
SHM = "/dev/shm"
INFINIBAND = "/sys/class/infiniband"
PCI_DEVICES = "/sys/bus/pci/devices"
# How far apart two PCI devices are, nearest first, in the words of nvidia-smi topo -m and
# NCCL_NET_GDR_LEVEL: PIX (one PCIe switch), PXB (several switches, no host bridge), PHB (one
# host bridge: the same CPU's root complex), NODE (the same NUMA node, across root complexes),
# SYS (across NUMA nodes: the CPUs' interconnect).
LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")


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


def pci_bus(text):
    """A PCI address as sysfs names it ("0000:19:00.0") from nvidia-smi's or the driver's
    ("00000000:19:00.0"); None for none."""
    text = (text or "").strip().lower()
    domain, colon, rest = text.partition(":")
    if not colon or not rest:
        return None
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def _place(device_link):
    """(the device's path on the PCI tree below /sys/devices as a list, its NUMA node or None)
    from its sysfs link; None where it has none (no sysfs, a virtual device)."""
    if not os.path.exists(device_link):
        return None
    real = os.path.realpath(device_link)
    parts = [p for p in real.split(os.sep) if p]
    root = next((i for i, part in enumerate(parts) if part.startswith("pci")), None)
    if root is None:
        return None
    numa = _read(os.path.join(real, "numa_node"))
    numa = int(numa) if numa and numa.lstrip("-").isdigit() and int(numa) >= 0 else None
    return parts[root:], numa


def link(a, b):
    """How far apart two devices are (LINKS) from their _place()s."""
    (path_a, numa_a), (path_b, numa_b) = a, b
    if path_a[0] == path_b[0]:
        shared = 0
        for one, other in zip(path_a[1:-1], path_b[1:-1]):
            if one != other:
                break
            shared += 1
        if not shared:
            return "PHB"
        # Below the bridges they share: one switch's ports, else several switches.
        depth = max(len(path_a), len(path_b)) - 1 - shared
        return "PIX" if depth <= 2 else "PXB"
    if numa_a is not None and numa_a == numa_b:
        return "NODE"
    return "SYS"


def gpu_nics(gpus, path=INFINIBAND, pci=PCI_DEVICES):
    """{gpu uuid: {nic: link}} for the GPUs (from _gpus.read_gpus: uuid, bus) and the
    InfiniBand/RoCE devices of this node, where both sit on the PCI tree; empty otherwise (no
    NIC, no GPU, no sysfs)."""
    try:
        devices = sorted(os.listdir(path))
    except OSError:
        return {}
    nics = {d: _place(os.path.join(path, d, "device")) for d in devices}
    nics = {d: place for d, place in nics.items() if place}
    found = {}
    for gpu in gpus or []:
        bus = pci_bus(gpu.get("bus"))
        place = _place(os.path.join(pci, bus)) if bus else None
        if place and nics and gpu.get("uuid"):
            found[gpu["uuid"]] = {d: link(place, nic) for d, nic in nics.items()}
    return found


def nearest(links):
    """The NICs of one GPU's {nic: link} that are nearest to it, and how near."""
    if not links:
        return [], None
    best = min(links.values(), key=LINKS.index)
    return sorted(d for d, how in links.items() if how == best), best


def host_facts(gpus=None):
    """The facts above, as node_facts returns them; `gpus` (read_gpus's) for gpu_nics."""
    return {"boot_id": boot_id(), "shm_bytes": shm_bytes(), "memlock": memlock(),
            "infiniband": infiniband(), "gpu_nics": gpu_nics(gpus)}
