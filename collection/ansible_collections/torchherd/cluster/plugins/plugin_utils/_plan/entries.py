# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Each node's entry in the plan: where its files go, what it runs the job with, and what the
plan found of it, so that the later phases derive nothing themselves."""

from __future__ import annotations

from typing import NamedTuple

from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.runtime import (
    node_python,
    node_venv,
)

DEFAULT_ROOT = "~/.torchherd"


class Hosts(NamedTuple):
    """What the plan found of each candidate host, by host."""

    vars: dict
    addresses: dict
    nprocs: dict
    firewalls: dict
    standbys: list


def node_root(hv):
    """The node's root: its C(torchherd_root), else the default."""
    return str(hv.get("torchherd_root") or DEFAULT_ROOT)


def code_dest(job, hv):
    """Where the node or the job puts the code (empty: C(<root>/code/<name>))."""
    return str(hv.get("torchherd_code_dest") or job["code_dest"] or "")


def node_entry(job, hosts, lock_hash, image, host, rank):
    """The entry of ``host`` at node rank ``rank`` (None for a spare). ``job``: the checked
    job with its name; ``lock_hash`` and ``image``: the job's venv and container, or None."""
    hv = hosts.vars[host]
    root = node_root(hv)
    python = node_python(job, hv, image)
    own = {}
    if lock_hash:
        own["venv"] = node_venv(lock_hash, root, python)
        python = f"{own['venv']['path']}/bin/python"
    return {"host": host, "address": hosts.addresses[host], "node_rank": rank, "root": root,
            "code_dir": code_dest(job, hv) or f"{root}/code/{job['name']}",
            "python": python, **own,
            "nproc_per_node": hosts.nprocs[host],
            "interface": str(hv.get("torchherd_socket_ifname") or job["socket_ifname"] or ""),
            "firewall": hosts.firewalls[host],
            # Started as the others, it waits in torchrun's rendezvous for a lost node.
            **({"standby": True} if host in hosts.standbys else {}),
            # In a SLURM job (the torchherd.cluster.slurm inventory's): the schedule's spawn
            # auto starts its launcher as a step of that job.
            **({"slurm_job": str(hv["torchherd_slurm_job_id"])}
               if hv.get("torchherd_slurm_job_id") not in (None, "") else {})}
