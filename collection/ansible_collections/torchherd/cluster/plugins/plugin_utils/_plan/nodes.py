# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The node table: which hosts are candidates, which of them are the job's nodes (in rank
order) and which wait as spares, their addresses and process counts, the master, and the node
count torchrun is given."""

from __future__ import annotations

import re

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.inventory import (
    address,
    host_setting,
    nproc,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.job import (
    job_spec,
    standby_mode,
)

_NNODES = re.compile(r"^(\d+):(\d+)$")


def candidate_hosts(job, groups, problems):
    """The hosts the job may run on, inventory order (the job's C(nodes), else its group's, else
    an inline host list's)."""
    group = job["node_group"]
    members = list(groups.get(group) or [])
    if not members and group not in groups and inline_hosts(job, groups):
        # An inline host list (-i node1,node2,) has no groups: its hosts are the nodes.
        group, members = "ungrouped", inline_hosts(job, groups)
    explicit = job["nodes"]
    names = explicit or members
    if not members:
        default = group == default_group()
        problems.append(f"node group '{group}': expected at least one host, found the group "
                        f"empty or missing from the inventory"
                        + (" and no inline host list (-i node1,node2,: hosts in no group)"
                           if default else "")
                        + f"; fix: list the nodes under [{group}] in the inventory, "
                        f"{'give them as -i node1,node2, ' if default else ''}or set "
                        f"torchherd_job.node_group (an inventory that Ansible could not parse "
                        f"leaves every group empty: see its warnings above, or set "
                        f"inventory_unparsed_failed = True)")
    seen = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    for name, count in seen.items():
        if count > 1:
            problems.append(f"host {name}: expected each node once, found it listed {count} "
                            f"times; fix: remove the duplicate from torchherd_job.nodes")
    if explicit and members:
        for name in seen:
            if name not in members:
                problems.append(f"host {name}: expected a member of group '{group}', found it "
                                f"missing there; fix: add it to [{group}] or drop it from "
                                f"torchherd_job.nodes")
    return list(dict.fromkeys(names))


def default_group():
    """The node group of a job that names none (the argument spec's default)."""
    return job_spec()["torchherd_job"]["options"]["node_group"]["default"]


def inline_hosts(job, groups):
    """The ungrouped hosts, where they are all the inventory has and the job names no group of
    its own: an inline host list's (-i node1,node2,), which Ansible puts in no group but
    C(ungrouped). An inventory with groups of its own keeps the node group's error: there an
    ungrouped host is more likely a login node than one of the job's."""
    if job["node_group"] != default_group() or set(groups) - {"all", "ungrouped"}:
        return []
    return list(groups.get("ungrouped") or [])


def outside_limit(hosts, limit_hosts):
    """The ``hosts`` a limit leaves out (``limit_hosts``: those it matches; None: no limit)."""
    if limit_hosts is None:
        return []
    matched = set(limit_hosts)
    return [name for name in hosts if name not in matched]


def rank_nodes(job, candidates, hvs, chosen, exclude, problems, outside=(), limit=""):
    """(the job's nodes in rank order, the spares behind them).

    The nodes are the first C(node_count) of the candidates, those not marked
    C(torchherd_spare) first (inventory order each); the rest wait as spares. Without
    C(node_count) the job takes every node not marked a spare. An excluded node's place goes
    to the first spare left (its node rank), or stays empty. A node ``outside`` the limit
    (``limit``, ansible-playbook's) is excluded too, but its place must be taken: a limit does
    not shrink the job. A spare outside it is no spare."""
    if chosen is not None:
        return list(chosen), []
    spare = {}
    for name in candidates:
        spare[name] = host_setting(name, hvs[name], "torchherd_spare", False, boolean, problems)
    order = [n for n in candidates if not spare[n]] + [n for n in candidates if spare[n]]
    wanted = job["node_count"] or sum(1 for n in candidates if not spare[n]) or len(candidates)
    if candidates and not 1 <= wanted <= len(candidates):
        problems.append(f"job.node_count: expected 1..{len(candidates)} (the nodes of the "
                        f"inventory, spares included), found {job['node_count']!r}; fix: lower "
                        f"it or add nodes")
    if not 0 <= job["min_node_count"] <= wanted:
        problems.append(f"job.min_node_count: expected 0..{wanted} (node_count; 0 means "
                        f"node_count), found {job['min_node_count']!r}; fix: lower it")
    left = {*exclude, *outside}
    spares = [n for n in order[wanted:] if n not in left]
    nodes, unfilled = [], []
    for name in order[:wanted]:
        if name not in left:
            nodes.append(name)
        elif spares:
            nodes.append(spares.pop(0))
        elif name in outside:
            unfilled.append(name)
    if unfilled:
        within = len(candidates) - len(outside)
        many = len(unfilled) > 1
        problems.append(f"host{'s' * many} {', '.join(unfilled)}: expected within the limit "
                        f"{limit} (the job's {wanted} nodes), found {'them' if many else 'it'} "
                        f"outside, and no spare within the limit to take "
                        f"{'their places' if many else 'its place'}; fix: widen the limit to "
                        f"take in {', '.join(unfilled)}, set job.node_count to {within} (the "
                        f"hosts within the limit), or mark a host within it torchherd_spare")
    fewest = min(wanted, job["min_node_count"] or wanted)
    if exclude and len(nodes) < fewest:
        problems.append(f"nodes: expected at least {fewest} (min_node_count, else node_count) "
                        f"besides those left out ({', '.join(sorted(exclude))}), found "
                        f"{len(nodes)}; fix: add spares (torchherd_spare) or lower "
                        f"min_node_count")
    return nodes, spares


def node_addresses(candidates, hvs, problems):
    """{host: the address the other nodes reach it at}; two hosts at one address are refused."""
    addresses = {name: address(hvs[name], name) for name in candidates}
    by_address = {}
    for name, addr in addresses.items():
        by_address.setdefault(addr, []).append(name)
    for addr, owners in by_address.items():
        if len(owners) > 1:
            problems.append(f"hosts {', '.join(owners)}: expected one address per node, found "
                            f"all of them at {addr}; fix: give each node its own "
                            f"ansible_host (or torchherd_address), or remove the duplicate entry")
    return addresses


def node_nprocs(job, candidates, hvs, problems):
    """(the job's processes per node, {host: the node's own}).

    Nodes with other GPU counts set their own: torchrun gives each process its global rank
    from the counts of the nodes before it."""
    default = nproc(job["nproc_per_node"])
    if default is None:
        problems.append(f"job.nproc_per_node: expected a positive integer or 'auto', found "
                        f"{job['nproc_per_node']!r}; fix: set it to the GPUs per node, "
                        f"or 'auto'")
    nprocs = {}
    for name in candidates:
        own = hvs[name].get("torchherd_nproc_per_node")
        nprocs[name] = default if own is None else nproc(own)
        if own is not None and nprocs[name] is None:
            problems.append(f"host {name}: torchherd_nproc_per_node: expected a positive "
                            f"integer or 'auto', found {own!r}; fix: correct it in the "
                            f"inventory")
    return default, nprocs


def choose_master(job, nodes, problems):
    """The rendezvous master: the job's, else the first node."""
    master = job["master"] or (nodes[0] if nodes else "")
    if job["master"] and master not in nodes:
        problems.append(f"job.master: expected one of the nodes ({', '.join(nodes)}), found "
                        f"{master!r}; fix: name a host of group '{job['node_group']}' or leave "
                        f"it empty")
    return master


def node_range(job, nodes, working, problems):
    """torchrun's C(--nnodes): the count of the ``working`` nodes (the standbys not counted),
    C(MIN:MAX) where torchrun's rendezvous waits for standbys or the job names a range."""
    nnodes = str(len(working))
    if standby_mode(job):
        # torchrun's rendezvous takes up to the job's nodes; a standby waits for a lost one.
        nnodes = f"{min(len(working), job['min_node_count'] or len(working))}:{len(working)}"
    if not job["nnodes"]:
        return nnodes
    match = _NNODES.match(job["nnodes"].strip())
    if job["rdzv"] != "c10d":
        problems.append(f"job.nnodes: expected it empty with rdzv 'static' (the node count "
                        f"is the inventory's), found {job['nnodes']!r}; fix: drop it or "
                        f"set rdzv: c10d")
    elif not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        problems.append(f"job.nnodes: expected MIN:MAX with 1 <= MIN <= MAX, found "
                        f"{job['nnodes']!r}; fix: e.g. nnodes: '2:{len(nodes) or 3}'")
    elif int(match.group(2)) < len(working) or int(match.group(1)) > len(working):
        problems.append(f"job.nnodes: expected MIN <= {len(working)} nodes <= MAX, found "
                        f"{job['nnodes']!r}; fix: widen the range or change the group")
    elif standby_mode(job) and int(match.group(2)) != len(working):
        problems.append(f"job.nnodes: expected MAX {len(working)} with detached restarts "
                        f"(a standby waits only while the rendezvous is full), found "
                        f"{job['nnodes']!r}; fix: drop nnodes (min_node_count sets MIN)")
    else:
        nnodes = f"{int(match.group(1))}:{int(match.group(2))}"
    return nnodes


def spawn_problems(job, hosts, hvs):
    """Why the nodes cannot be spawned as the job says (srun needs a SLURM job's hosts).
    ``hosts``: the nodes and the spares (one may take a node's place after preflight)."""
    if job["spawn"] != "srun":
        return []
    outside = [n for n in hosts if not hvs[n].get("torchherd_slurm_job_id")]
    if not outside:
        return []
    return [f"job.spawn: expected nodes of a SLURM job (the torchherd.cluster.slurm inventory) "
            f"for spawn srun, found {', '.join(outside)} outside one; fix: use that inventory, "
            f"or spawn ssh"]
