# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Each node's firewall settings: the job's, unless the host sets its own."""

from __future__ import annotations

from ansible.module_utils.common.validation import check_type_list
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.inventory import (
    host_setting,
)


def firewall(name, hv, job, addresses, master, port, problems):
    """One node's firewall settings; ``addresses``: those of the job's nodes."""
    ports = host_setting(name, hv, "torchherd_firewall_ports", job["firewall_ports"],
                         check_type_list, problems)
    return {
        "enabled": host_setting(name, hv, "torchherd_firewall_enabled", job["firewall"],
                                boolean, problems),
        "mode": str(hv.get("torchherd_firewall_mode") or job["firewall_mode"]),
        "ports": ([str(port)] if name == master else []) + [str(p) for p in ports],
        "peers": [addr for host, addr in addresses.items() if host != name],
        "backend": str(hv.get("torchherd_firewall_backend") or "auto"),
        "persistent": host_setting(name, hv, "torchherd_firewall_persistent",
                                   job["firewall_persistent"], boolean, problems),
        "become": host_setting(name, hv, "torchherd_firewall_become", True, boolean, problems),
    }


def firewall_port_problems(nodes, master, firewalls):
    """gloo and NCCL connect between the nodes on ports the kernel picks: mode ports without
    ports (the master port is the rendezvous's alone) would let the rendezvous through and
    block the collectives (a hang at init)."""
    if len(nodes) > 1 and any(f["enabled"] and f["mode"] == "ports"
                              and len(f["ports"]) == (1 if h == master else 0)
                              for h, f in firewalls.items()):
        return ["job.firewall_ports: expected the ports gloo and NCCL use with "
                "firewall_mode ports, found none; fix: pin them to a range "
                "(net.ipv4.ip_local_port_range on every node) and list it in "
                "firewall_ports, or use firewall_mode members (see the firewall "
                "role's README.md)"]
    # The rules are the plan's, and a port the master picks in preflight is none of it.
    if any(f["enabled"] and f["mode"] == "ports" and "auto" in f["ports"]
           for f in firewalls.values()):
        return [f"job.master_port: expected a port number with firewall_mode ports (its rules "
                f"let the master port in on {master}), found auto; fix: give master_port a "
                f"free port, or use firewall_mode members"]
    return []
