# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The plan: a pure function from the node group and the job spec to ranks and rendezvous."""

from __future__ import annotations

DOCUMENTATION = r"""
name: plan
author: torchherd developers
version_added: 0.1.0
short_description: Compute a torchrun launch plan from the node group and a job
description:
  - Turns the node group of the inventory (an inline host list's hosts, C(-i node1,node2,),
    where the inventory has no groups and the job names none) into node_rank (inventory order), nnodes,
    nproc_per_node, world size, master address and port, and derives every per-node value the
    later phases use (root, code directory, Python, firewall settings), so that play vars only
    pass the plan on.
  - Takes the job through the validator of the role argument spec C(torchherd.cluster.plan)
    (ansible-core's C(ArgumentSpecValidator)), as the role and the driver do, so that all three
    coerce the same way and fill in the same defaults from one definition of the job.
  - Fails with one message listing every problem (empty group, host listed twice, two hosts with
    one address, port out of range, bad nproc_per_node, unknown master, a script outside
    code_src, a launch whose code_src holds the root or code directory of a node on this
    machine) before any node is touched.
  - A node is this machine where its C(ansible_connection) is C(local) (the sync copies to it
    as to a local path); its C(torchherd_root) (and C(torchherd_code_dest), else the job's
    C(code_dest)) resolved as the sync resolves them (C(~), relative paths and symlinks) must
    lie outside C(code_src), or be left out of the code by the sync's ignore rules (the job's
    C(excludes), C(.gitignore), C(.torchherdignore) at C(code_src)). Otherwise the sync would
    copy the node's earlier copies into the next one, launch after launch.
positional: _input, groups, hostvars, run_id, playbook
extends_documentation_fragment:
  - torchherd.cluster._inventory
options:
  _input:
    description: The job (C(torchherd_job)).
    type: dict
    required: true
  hostvars:
    description:
      - The inventory's C(hostvars); C(torchherd_address), else C(ansible_host), else the name
        gives a node's address.
      - A node's C(torchherd_root), C(torchherd_python) (else C(ansible_python_interpreter)),
        C(torchherd_code_dest), C(torchherd_nproc_per_node), C(torchherd_socket_ifname) and
        C(torchherd_firewall_*) variables set its own values where nodes differ; strings from
        an INI inventory are coerced as Ansible coerces booleans and lists.
  run_id:
    description: Run id for a job that names none (the role generates it); the job's own wins.
    type: str
    default: ""
  playbook:
    description:
      - The playbook the plan is for. A C(launch) needs the job's script; a C(verify) checks the
        nodes also without one (a job-less verify).
    type: str
    default: launch
    choices: [launch, verify]
  exclude:
    description:
      - Nodes to leave out from the start, each with why (the driver's restart after a node
        was lost, C(torchherd_exclude)). A spare takes an excluded node's place (its node rank);
        without one the job runs on fewer nodes where C(min_node_count) allows.
    type: dict
  limit:
    description:
      - ansible-playbook's C(--limit) (C(ansible_limit)), the host pattern O(limit_hosts) came
        from; the messages name it.
    type: str
    default: ""
  limit_hosts:
    description:
      - The hosts the limit matches (C(query('ansible.builtin.inventory_hostnames',
        ansible_limit))); null without a limit. A host of the node group outside it is no
        candidate. A spare takes the place (the node rank) of a node outside it; where none
        is left the plan fails naming the nodes, the limit and the fix (a limit does not make
        the job smaller, C(min_node_count) notwithstanding). A spare outside it is left out.
    type: list
    elements: str
  chosen:
    description:
      - The job's nodes in rank order, as C(torchherd.cluster.choose_nodes) took them after
        preflight (healthy spares in the place of nodes that failed it). Without it the nodes
        are the first C(node_count) of the node group, those not marked C(torchherd_spare)
        first, and the rest are the plan's RV(_value.spares).
    type: list
    elements: str
  standbys:
    description:
      - Those of O(chosen) that wait as standbys (C(torchherd.cluster.choose_nodes) keeps the
        healthy spares left for a detached job that allows restarts, whose restarts are
        torchrun's own). They are started with the others and are not counted in C(nnodes) or
        the world size.
    type: list
    elements: str
    default: []
"""

EXAMPLES = r"""
- name: Compute the plan
  ansible.builtin.set_fact:
    torchherd_plan: "{{ torchherd_job | torchherd.cluster.plan(groups, hostvars, run_id='20250101-120000-0a1b') }}"
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    run_id:
      description: The job's run id, else the O(run_id) argument.
      type: str
      sample: 20250101-120000-0a1b
    job:
      description:
        - The job, coerced as the argument spec says, with every default filled in.
        - C(secret_env) keeps its names only, each value replaced by C(********) (filter
          C(torchherd.cluster.redact)), because the plan is a fact, which Ansible shows and
          result callbacks record. The start takes the values from C(torchherd_job) itself.
      type: dict
    nodes:
      description: One entry per node, in rank order.
      type: list
      elements: dict
      contains:
        host:
          description: Inventory hostname.
          type: str
          sample: node0
        address:
          description: Address the other nodes reach it at.
          type: str
          sample: 10.0.0.1
        node_rank:
          description: torchrun's C(--node-rank).
          type: int
          sample: 0
        root:
          description: The node's C(torchherd_root), default C(~/.torchherd).
          type: str
          sample: ~/.torchherd
        code_dir:
          description:
            - Where the code goes on the node, the node's C(torchherd_code_dest), else the job's
              C(code_dest), else C(<root>/code/<name>); may start with C(~).
          type: str
          sample: ~/.torchherd/code/train
        python:
          description:
            - The node's C(torchherd_python), else the job's C(python), else the node's
              C(ansible_python_interpreter), else empty.
            - With the job's C(venv), the interpreter of the node's venv (C(<root>/venvs/<key>/bin/python)).
            - With the job's C(container), the image's, C(container.python) (C(python3)) unless
              the node or the job names another.
          type: str
          sample: /opt/venv/bin/python
        venv:
          description:
            - Only with the job's C(venv) - the node's venv, C(path) (C(<root>/venvs/<key>)),
              C(key) (a hash of the lock, of C(system_site_packages) and of C(base_python)) and
              C(base_python), the interpreter it is made from (what C(python) would be without
              a venv).
          type: dict
        nproc_per_node:
          description: The node's C(torchherd_nproc_per_node), else the job's; an integer or C(auto).
          type: raw
          sample: 2
        interface:
          description:
            - The interface the user named for the job's traffic on this node (the node's
              C(torchherd_socket_ifname), else the job's C(socket_ifname)); empty lets preflight
              choose it by the route to the master address.
          type: str
          sample: ib0
        standby:
          description:
            - Only on a standby (O(standbys)) - true. torchrun's elastic rendezvous holds it
              back while the job has its nodes, and takes it in when a restart finds one lost.
          type: bool
        slurm_job:
          description:
            - Only on a node of a SLURM job - its job id (the node's C(torchherd_slurm_job_id),
              from the C(torchherd.cluster.slurm) inventory). The schedule's C(spawn) auto starts
              its launcher as a step of that job (srun).
          type: str
          sample: "4242"
        firewall:
          description: The node's firewall settings, the job's unless the node sets C(torchherd_firewall_*) itself.
          type: dict
          contains:
            enabled:
              description: Whether the launch changes this node's firewall.
              type: bool
            mode:
              description: C(members) or C(ports).
              type: str
            ports:
              description: TCP ports and ranges let in with mode C(ports), the master port first on the master.
              type: list
              elements: str
              sample: ["29500", "50000-50999"]
            peers:
              description: Addresses of the job's other nodes.
              type: list
              elements: str
            backend:
              description: The node's C(torchherd_firewall_backend), default C(auto).
              type: str
            persistent:
              description: Keep the rules across a reboot until teardown.
              type: bool
            become:
              description: Whether changing the firewall uses become (C(torchherd_firewall_become), default true).
              type: bool
    nnodes:
      description:
        - Number of nodes (C(MIN:MAX) for elastic jobs), standbys not counted.
        - A detached job that allows restarts has C(MIN:MAX) from its C(min_node_count) and its
          nodes, so that torchrun's rendezvous is full without the standbys.
      type: str
    nproc_per_node:
      description: Processes per node, or C(auto) until preflight resolves it; null when the
        nodes set different counts (see each node's).
      type: raw
    world_size:
      description: Total number of ranks (the sum over the nodes), or null while a node's
        nproc_per_node is C(auto).
      type: int
    spares:
      description:
        - Nodes preflight checks beside the job's nodes (the job's C(node_count) is smaller than
          the node group, or hosts are marked C(torchherd_spare)), each an entry like those of
          RV(_value.nodes) with C(node_rank) null. C(torchherd.cluster.choose_nodes) takes the
          first healthy ones for nodes that failed preflight. Empty otherwise.
      type: list
      elements: dict
    min_nodes:
      description: The fewest nodes the job accepts (its C(min_node_count), else all of them).
      type: int
    excluded:
      description: The nodes O(exclude) and the limit (O(limit_hosts)) left out, and why.
      type: dict
    left_out:
      description: Only after C(torchherd.cluster.choose_nodes) - each candidate left out and
        why (its preflight problems, or a spare not needed; a detached job that allows
        restarts keeps its healthy spares as standbys instead).
      type: dict
    master:
      description: C(host), C(addr) and C(port) of the rendezvous master.
      type: dict
    container:
      description: The job's C(container) - C(image), C(runtime), C(pull), C(python) (the
        interpreter in the image, every node's C(python) unless the node or the job names
        another) - null without an image.
      type: dict
    venv:
      description: The hash of the job's C(venv.lock) and C(venv.system_site_packages), null
        without a lock (which is read on the controller, and refused unless every requirement
        is pinned).
      type: str
    barrier:
      description: Whether the start's barrier is on (false where a node's
        C(torchherd_torchrun_barrier) turns it off); the schedule decides where it runs.
      type: bool
    warm:
      description: Whether the launcher may be started ahead, in preflight (false where a node's
        C(torchherd_torchrun_warm) turns it off); the schedule decides whether it is.
      type: bool
"""

from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.filter.redact import redact
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan import runtime
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.entries import (
    Hosts,
    node_entry,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.firewall import (
    firewall,
    firewall_port_problems,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.inventory import (
    every_host_allows,
    host_vars,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.job import (
    bound_problems,
    id_problems,
    job_name,
    launcher_problems,
    master_port,
    normalize,
    script_path,
    secret_problems,
    standby_problems,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.local_code import (
    nested_code_problems,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.nodes import (
    candidate_hosts,
    choose_master,
    node_addresses,
    node_nprocs,
    node_range,
    outside_limit,
    rank_nodes,
    spawn_problems,
)


def plan(job, groups, hostvars, run_id="", playbook="launch", chosen=None, exclude=None,
         standbys=(), limit="", limit_hosts=None):
    """Return the launch plan for ``job``; raise AnsibleFilterError listing every problem.

    ``run_id`` is the one the plan role generates for a job that names none: the filter
    stays pure (no clock, no randomness). ``chosen`` (from C(choose_nodes)) names the nodes of
    the job, in rank order, after preflight took healthy ones for unhealthy ones, and
    ``standbys`` those of them that wait as standbys (the last ones). ``limit_hosts``: the
    hosts ansible-playbook's limit ``limit`` matches (None: no limit)."""
    if not isinstance(job, dict):
        raise AnsibleFilterError(
            f"torchherd_job: expected a dict (the job spec), found {type(job).__name__}"
        )
    merged = normalize(job)
    problems = []
    script = script_path(merged, playbook, problems)
    group = candidate_hosts(merged, groups, problems)
    hvs = {name: host_vars(name, hostvars) for name in group}
    exclude = dict(exclude or {})
    outside = outside_limit(group, limit_hosts)
    nodes, spares = rank_nodes(merged, group, hvs, chosen, exclude, problems, outside, limit)
    # Hosts outside the limit are none of the plan's: ansible-playbook does not reach them.
    candidates = [name for name in group if name not in outside]
    addresses = node_addresses(candidates, hvs, problems)
    port = master_port(merged, problems)
    nproc, nprocs = node_nprocs(merged, candidates, hvs, problems)
    master = choose_master(merged, nodes, problems)
    standbys = [n for n in standbys if n in nodes]
    working = [n for n in nodes if n not in standbys]  # the nodes the job's world counts
    problems += standby_problems(merged)
    nnodes = node_range(merged, nodes, working, problems)
    problems += spawn_problems(merged, nodes + spares, hvs)
    problems += secret_problems(merged, nodes + spares, hostvars)
    if playbook == "launch":  # the one that syncs the code
        problems += nested_code_problems(merged, nodes + spares, hvs)
    problems += launcher_problems(merged, {h: nprocs[h] for h in nodes})
    problems += bound_problems(merged)
    run_id = merged["run_id"] or run_id
    problems += id_problems(run_id, merged["name"])
    firewalls = {h: firewall(h, hvs[h], merged, {n: addresses[n] for n in nodes}, master,
                             port, problems)
                 for h in candidates}
    # The start barrier is the whole launch's (a node without it would never come to it).
    barrier = every_host_allows(candidates, hvs, "torchherd_torchrun_barrier", problems)
    # The launcher started ahead in preflight (the schedule's start.warm).
    warm = every_host_allows(candidates, hvs, "torchherd_torchrun_warm", problems)
    problems += firewall_port_problems(nodes, master, firewalls)
    venv = runtime.venv(merged, problems)
    container = runtime.container(merged, problems)
    if problems:
        raise AnsibleFilterError("torchherd plan: the job cannot start:\n  - "
                                 + "\n  - ".join(problems))

    merged.update(name=job_name(merged, script), script=script, nproc_per_node=nproc,
                  master_port=port)
    hosts = Hosts(hvs, addresses, nprocs, firewalls, standbys)
    uniform = list(dict.fromkeys(nprocs[h] for h in nodes))
    return {
        "run_id": run_id,
        "job": redact(merged),
        # The hash of the job's lock (None without one); each node's venv is in its entry.
        "venv": venv,
        # The job's image (None without one): every node runs the launcher inside it.
        "container": container,
        "nodes": [node_entry(merged, hosts, venv, container, h, i) for i, h in enumerate(nodes)],
        # Candidates preflight checks beside the nodes; C(choose_nodes) puts the first healthy
        # ones in the place of nodes that failed it. Empty where the job takes every node.
        "spares": [node_entry(merged, hosts, venv, container, h, None) for h in spares],
        "min_nodes": min(len(working), merged["min_node_count"] or len(working)),
        # Nodes this launch leaves out from the start, and why (the driver's restart).
        "excluded": {**{h: str(why) for h, why in exclude.items() if h in group},
                     **{h: f"outside the limit {limit}" for h in outside}},
        "nnodes": nnodes,
        "nproc_per_node": uniform[0] if len(uniform) == 1 else None,
        "world_size": None if "auto" in uniform else sum(nprocs[h] for h in working),
        "master": {"host": master,
                   "addr": merged["master_addr"] or addresses[master],
                   "port": port},
        "barrier": barrier,
        "warm": warm,
    }


class FilterModule:
    """torchherd planning filters."""

    def filters(self):
        return {"plan": plan}
