# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The preflight gate: compare the facts of every node and decide whether the job may start."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS
from ansible_collections.torchherd.cluster.plugins.plugin_utils._answers import with_facts
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate import (
    CHECKS,
    GPU_CHECKS,
    GPU_WARNINGS,
    NCCL_CHECKS,
    NODE_CHECKS,
    NODE_ENV,
    NODE_WARNINGS,
    downgraded,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.answered import answered
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import Run, problem
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.interconnect import (
    interconnect_verdict,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.network import (
    chosen_interfaces,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.procs import resolve
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.running import (
    with_master_port,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.table import (
    host_rows,
    render,
)

DOCUMENTATION = r"""
name: gate
author: torchherd developers
version_added: 0.1.0
short_description: Compare the nodes' preflight facts and list every reason the job cannot start
description:
  - Takes the facts C(torchherd.cluster.node_facts) gathered on each node and the plan.
  - Checks that every node answered, that the job interpreter runs and imports torch, that
    versions match across nodes, that rsync is there, that the master port is free on the master,
    that nccl jobs have GPUs and NCCL, that no two nodes share GPUs, that no other run with this
    run id is alive, and resolves O(plan.nproc_per_node=auto) and a master port of C(auto).
  - For nccl jobs, checks the GPUs each node's processes will use (free of other processes, an
    architecture the torch build has kernels for, a driver new enough for its CUDA, a compute
    mode that lets the job in), that NCCL tells the nodes apart, and the InfiniBand/RoCE ports;
    and warns of what slows or endangers a job without stopping it (see RV(warnings)). The
    checks are listed in the docs' preflight section.
  - Each problem names the host, the check, what was expected, what was found and the fix.
positional: _input, hostvars, plan
options:
  _input:
    description: The hosts of the run, in rank order.
    type: list
    elements: str
    required: true
  hostvars:
    description: C(hostvars); each host's registered C(torchherd_facts) is read.
    type: dict
    required: true
  plan:
    description: The plan from C(torchherd.cluster.plan).
    type: dict
    required: true
  match:
    description:
      - Fact keys that must be equal on every node; the version of the job's launcher (other
        than torchrun) is compared as well.
      - C(python.minor) is the major and minor version of the job's Python (3.11); a patch
        release (3.11.2 against 3.11.9) does not break a job, another minor version does
        (pickled objects, compiled extensions).
    type: list
    elements: str
    default: [python.minor, torch.version, torch.cuda, torch.nccl]
"""

EXAMPLES = r"""
- name: Compare the nodes
  ansible.builtin.set_fact:
    torchherd_gate: "{{ ansible_play_hosts_all | torchherd.cluster.gate(hostvars, torchherd_plan) }}"
  run_once: true
"""

RETURN = r"""
_value:
  description: The verdict.
  type: dict
  contains:
    ok:
      description: Whether the job may start.
      type: bool
    problems:
      description: One dict per problem with C(host), C(check), C(expected), C(found), C(fix).
      type: list
      elements: dict
    warnings:
      description:
        - What makes a job slow or fragile but lets it start, in the same form as RV(problems)
          (persistence mode off, a small C(/dev/shm), ECC or Xid history, ...), and the
          problems whose check the job's C(preflight_warn) names.
      type: list
      elements: dict
    nproc_per_node:
      description: Processes per node with C(auto) resolved; null when the nodes run different
        counts (see RV(nprocs)).
      type: int
    nprocs:
      description: Host to its processes (its own C(torchherd_nproc_per_node), or the job's,
        C(auto) resolved to its GPU count, 1 without GPUs).
      type: dict
    world_size:
      description: Total number of ranks, the sum of RV(nprocs).
      type: int
    master_port:
      description: The master port the launch uses - the job's C(master_port), or where it is
        C(auto) the free port the master picked (RV(torchherd.cluster.node_facts#module:port_picked));
        null where the master gave none.
      type: int
    interfaces:
      description:
        - Host to the interface its job traffic uses (C(name), C(address), C(how)), from
          RV(torchherd.cluster.node_facts#module:interface); the start exports the name as
          GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME on that host and its barrier connects from
          the address.
      type: dict
    interconnect:
      description:
        - The interconnect check's verdict where it ran (null otherwise) - C(ok), C(allreduce)
          (C(busbw) and C(algbw) in GB/s, C(latency_us), C(bytes), C(world_size)), C(pairs)
          (C(a), C(b), C(gbps) each way), C(threshold_gbps) and C(threshold_why), C(slow_nodes),
          C(slow_links), every node's C(results), and C(reused) (C(run_id), C(at)) when the
          measure of an earlier run of the same nodes was reused.
        - Its problems are among RV(problems), check C(interconnect), naming the node slow with
          every peer, or the link between two.
      type: dict
    table:
      description: A per-host table of the key facts and the problems, for people.
      type: str
    node_env:
      description:
        - "Per host, what the start adds to the job's environment from the node's facts (the
          job's own env wins): for nccl jobs across nodes with InfiniBand/RoCE ports,
          C(NCCL_IB_HCA) naming exactly the ACTIVE ones (C(=mlx5_0:1,mlx5_1:1)), of those only
          the ones nearest to the job's GPUs on the PCI tree where the facts place both, unless
          the job sets it or C(NCCL_IB_DISABLE)."
      type: dict
    facts:
      description: Host to its C(torchherd_facts) as the gate read them (the answer of
        M(torchherd.cluster.node_facts), or why there is none), for the run's C(preflight.json).
      type: dict
    left_out:
      description: The plan's C(excluded) and C(left_out) (C(torchherd.cluster.choose_nodes)),
        each node the launch left out and why; empty where the job takes every node.
      type: dict
    with_facts:
      description:
        - Where the nodes' starts came with their facts calls (the schedule's
          C(start.with_facts)), what became of them - C(started) (the job went on on every
          node), C(refused) (each node that refused at the barrier, and why - its facts changed
          since the last launch's preflight) and C(called_off) (what the barrier said where it
          called the start off; the launch then took the full path) - else null.
      type: dict
"""


def gate(hosts, hostvars, plan, match=None):
    """The verdict on the nodes' facts (see RETURN): the checks of every family
    (plugin_utils/_gate), their problems listed in the registry's order, and the process
    counts and backend resolved from the facts."""
    job = plan["job"]
    facts, problems = answered(hosts, hostvars)
    # Every check, and the start after them, sees the master port the launch uses.
    plan = with_master_port(plan, facts)
    usable = {h: f for h, f in facts.items() if f["torch"].get("version")}
    run = Run(hosts=hosts, hostvars=hostvars, plan=plan, match=match, facts=facts, usable=usable,
              launcher=LAUNCHERS[job.get("launcher", "torchrun")],
              **resolve(hosts, hostvars, plan, usable))
    for host, f in facts.items():
        for check in NODE_CHECKS:
            problems += check(host, f, plan)
    for check in CHECKS:
        problems += check(run)
    warnings = []
    for host, f in facts.items():
        for check in NODE_WARNINGS:
            warnings += check(host, f, run.nprocs[host], plan)
    node_env = {}
    if run.backend == "nccl":
        for check in NCCL_CHECKS:
            problems += check(run)
        for host, f in usable.items():
            needed = run.needed(host)
            for check in GPU_CHECKS:
                problems += check(host, f, needed, plan)
            for check in GPU_WARNINGS:
                warnings += check(host, f, needed, plan)
            env = {k: v for hook in NODE_ENV for k, v in hook(host, f, needed, plan).items()}
            if env:
                node_env[host] = env
    problems, warnings = downgraded(problems, warnings, job.get("preflight_warn") or [])
    interconnect = interconnect_verdict(hosts, hostvars, job, facts)
    if interconnect:
        problems += [problem(*p) for p in interconnect.pop("problems")]
    interfaces = chosen_interfaces(facts)
    left_out = {**(plan.get("excluded") or {}), **(plan.get("left_out") or {})}
    distinct = set(run.nprocs.values())
    return {
        "ok": not problems,
        "problems": problems,
        "warnings": warnings,
        "nproc_per_node": distinct.pop() if len(distinct) == 1 else None,
        "nprocs": run.nprocs,
        "world_size": sum(run.nprocs.values()),
        "master_port": plan["master"]["port"],
        "interfaces": interfaces,
        "backend": run.backend,
        "interconnect": interconnect,
        "left_out": left_out,
        "node_env": node_env,
        "facts": {host: hostvars.get(host, {}).get("torchherd_facts") for host in hosts},
        "with_facts": with_facts(hosts, hostvars),
        "table": render(host_rows(hosts, facts, interfaces, run.gpu_counts, run.nprocs),
                        problems, interconnect, warnings, left_out),
    }


class FilterModule:
    """torchherd preflight filters."""

    def filters(self):
        return {"gate": gate}
