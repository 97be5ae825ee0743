# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Spares: after preflight, the job runs on the first healthy nodes."""

from __future__ import annotations

DOCUMENTATION = r"""
name: choose_nodes
author: torchherd developers
version_added: 0.2.0
short_description: Put healthy spares in the place of nodes that failed preflight
description:
  - Takes a plan with spares (C(torchherd.cluster.plan) with a C(node_count) below the node
    group, or hosts marked C(torchherd_spare)) and the gate's verdict on every candidate, and
    returns the plan of the nodes the job runs on. A node with a problem of its own is left out;
    the first healthy spare (inventory order) takes its node rank; where no spare is left the
    job runs on fewer nodes if its C(min_node_count) allows it.
  - Every value that follows from the nodes (ranks, master, firewall peers, nnodes, world size)
    comes from the plan filter run again on the chosen nodes, with the plan's own job.
  - Returns the plan unchanged where it has no spares, or where no choice can save the launch
    (a problem between nodes or of the launch itself, too few healthy nodes, or a master named
    by the job that failed). The gate then refuses the launch as it would without spares.
positional: _input, gate, groups, hostvars
extends_documentation_fragment:
  - torchherd.cluster._inventory
options:
  _input:
    description: The plan (C(torchherd_plan)).
    type: dict
    required: true
  gate:
    description: The verdict of C(torchherd.cluster.gate) on the plan's nodes and spares.
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Take the first healthy nodes
  ansible.builtin.set_fact:
    torchherd_plan: "{{ torchherd_plan | torchherd.cluster.choose_nodes(torchherd_gate, groups, hostvars) }}"
"""

RETURN = r"""
_value:
  description: The plan on the chosen nodes, without spares, with C(left_out) naming each
    candidate left out and why.
  type: dict
"""


from ansible_collections.torchherd.cluster.plugins.filter.plan import plan
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.spares import healthy_choice


def choose_nodes(plan_, gate_, groups, hostvars):
    """The plan again on the healthy nodes (see RETURN of the filter docs): a spare takes the
    place (the node rank) of a node that failed preflight, the master is the first chosen node
    unless the job names one, and every value that follows from the nodes (ranks, firewall
    peers, the master port's rule, nnodes, world size) is the plan filter's own. Unchanged where
    the plan has no spares or no choice can save the launch (the gate then refuses it as
    without spares)."""
    if not plan_.get("spares"):
        return plan_
    choice = healthy_choice(plan_, gate_)
    if choice is None:
        return plan_
    chosen, left_out, standbys = choice
    # The plan's own job (normalized; secret values redacted, which no node-derived value
    # reads). The script was checked by the first plan; it is the same job.
    again = plan(plan_["job"], groups, hostvars, run_id=plan_["run_id"], playbook="verify",
                 chosen=chosen, standbys=standbys)
    result = dict(plan_)
    result.update({key: again[key] for key in ("nodes", "nnodes", "nproc_per_node",
                                               "world_size", "master", "barrier")})
    result.update(spares=[], left_out={**plan_.get("excluded", {}), **left_out})
    return result


class FilterModule:
    """torchherd spare-node filters."""

    def filters(self):
        return {"choose_nodes": choose_nodes}
