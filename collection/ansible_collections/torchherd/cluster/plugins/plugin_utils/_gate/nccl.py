# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What NCCL needs between the nodes of an nccl job: to tell them apart, InfiniBand/RoCE ports
that are up and a locked-memory limit that lets it register its buffers; and the HCAs the start
names to it (NCCL_IB_HCA)."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._hostfacts import nearest
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import (
    PREFLIGHT_WARN_FIX,
    mib,
    problem,
)


def _env(plan):
    return plan["job"].get("env") or {}


def _ib_used(plan, f):
    """The job spans nodes (on one, NCCL goes through shared memory and P2P, never the
    network), the node has InfiniBand/RoCE devices and the job's NCCL_IB_DISABLE leaves them on
    (a setting in /etc/nccl.conf or the node's own environment is not seen: the job's env is)."""
    return len(plan.get("nodes") or []) > 1 and bool(f.get("infiniband")) \
        and str(_env(plan).get("NCCL_IB_DISABLE", "0")).strip() in ("", "0")


def host_identity(usable, plan):
    """NCCL tells every node from the others (the hash of host name and boot id, or
    NCCL_HOSTID): nodes it takes for one try shared memory and P2P between machines."""
    hostid = _env(plan).get("NCCL_HOSTID")
    owners = {}
    for host, f in usable.items():
        if hostid:
            key = f"NCCL_HOSTID {hostid} (the job's env)"
        elif f.get("hostname") and f.get("boot_id"):
            key = f"host name {f['hostname']} and boot id {f['boot_id']}"
        else:
            continue
        owners.setdefault(key, []).append(host)
    return [problem(
        ", ".join(sharing), "host identity", "each node its own identity to NCCL (host name "
        "and boot id, or NCCL_HOSTID)", f"{key} on all of them",
        "list one inventory entry per machine; give cloned machines their own host names; "
        "leave NCCL_HOSTID out of the job's env (or set it per node)"
        + PREFLIGHT_WARN_FIX.format(check="host identity"))
        for key, sharing in owners.items() if len(sharing) > 1]


def _hca_selects(spec, device, port):
    """Whether NCCL_IB_HCA `spec` selects `port` of `device`, as NCCL reads it: entries
    name[:port], comma-separated, a prefix of the device's name unless the list starts with
    '=', every device but those with '^'."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec.lstrip("^")
    exact = spec.startswith("=")
    named = False
    for entry in filter(None, (e.strip() for e in spec.lstrip("=").split(","))):
        name, _colon, wanted = entry.partition(":")
        if (device == name if exact else device.startswith(name)) and wanted in ("", port):
            named = True
    return named != exclude


def rdma_ports(host, f, needed, plan):
    """The InfiniBand/RoCE ports NCCL will use are up: those NCCL_IB_HCA selects, else at least
    one (NCCL uses the active ones and falls back to TCP sockets, many times slower, without)."""
    if not _ib_used(plan, f):
        return []
    ports = [(device, port, (info or {}).get("state") or "?")
             for device, found in sorted(f["infiniband"].items())
             for port, info in sorted((found or {}).items())]
    listed = ", ".join(f"{d}:{p} {state}" for d, p, state in ports)
    spec = str(_env(plan).get("NCCL_IB_HCA") or "")
    fix = PREFLIGHT_WARN_FIX.format(check="rdma port")
    if spec:
        used = [p for p in ports if _hca_selects(spec, p[0], p[1])]
        down = [p for p in used if p[2] != "ACTIVE"]
        if used and not down:
            return []
        return [problem(
            host, "rdma port", f"the ports NCCL_IB_HCA={spec} selects ACTIVE",
            ", ".join(f"{d}:{p} {state}" for d, p, state in down) if used
            else f"it selects none of {listed}",
            "bring the port up (ibstat shows it; cable, switch, subnet manager), or name only "
            "active ones in NCCL_IB_HCA" + fix)]
    if any(port[-1] == "ACTIVE" for port in ports):
        return []
    return [problem(
        host, "rdma port", "an ACTIVE InfiniBand/RoCE port for NCCL", listed,
        "bring a port up (ibstat shows them; cable, switch, subnet manager), or set "
        "NCCL_IB_DISABLE=1 in the job's env to run NCCL over TCP" + fix)]


def ib_hca(f, plan, needed=()):
    """The NCCL_IB_HCA the start sets on a node of an nccl job that spans nodes, where the job
    leaves NCCL's InfiniBand/RoCE on and names no HCAs itself: the ports that are ACTIVE
    ("=mlx5_0:1,mlx5_1:1"), so that NCCL never picks one that is down; and where the facts place
    the job's GPUs (`needed`) and the devices on the PCI tree (gpu_nics), only the active devices
    nearest to one of those GPUs, so that a NIC no GPU of the job is near (storage, the other
    socket's) carries none of its traffic. None where there is nothing to choose (no device,
    none active) or the job chose."""
    if not _ib_used(plan, f) or _env(plan).get("NCCL_IB_HCA"):
        return None
    active = [(device, port) for device, found in sorted(f["infiniband"].items())
              for port, info in sorted((found or {}).items(), key=lambda p: (len(p[0]), p[0]))
              if (info or {}).get("state") == "ACTIVE"]
    near = set()
    devices = {device for device, _port in active}
    for gpu in needed:
        links = (f.get("gpu_nics") or {}).get(str(gpu.get("uuid") or "").removeprefix("GPU-"))
        near.update(nearest({d: how for d, how in (links or {}).items() if d in devices})[0])
    chosen = [f"{d}:{p}" for d, p in active if d in near or not near]
    return "=" + ",".join(chosen) if chosen else None


def memlock(host, f, needed, plan):
    """RDMA locks (registers) the buffers NCCL sends from: a small ulimit -l fails it."""
    limit = f.get("memlock")
    if not _ib_used(plan, f) or limit in (None, "unlimited"):
        return []
    return [problem(host, "memlock", "ulimit -l unlimited where NCCL uses InfiniBand/RoCE",
                    mib(int(limit)),
                    "set memlock unlimited for the job's user (/etc/security/limits.conf: "
                    "'* - memlock unlimited'; LimitMEMLOCK=infinity for sshd's unit; "
                    "--ulimit memlock=-1 for a container)")]


def identity(run):
    return host_identity(run.usable, run.plan)


def ib_env(host, f, needed, plan):
    """The node's NCCL_IB_HCA (ib_hca), where it has one to set."""
    hca = ib_hca(f, plan, needed)
    return {"NCCL_IB_HCA": hca} if hca else {}


NCCL_CHECKS = (identity,)
GPU_CHECKS = (rdma_ports,)
GPU_WARNINGS = (memlock,)
DOWNGRADABLE = ("rdma port", "host identity")
NODE_ENV = (ib_env,)
