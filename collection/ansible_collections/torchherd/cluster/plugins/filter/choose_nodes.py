# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Spares: after preflight, the job runs on the first healthy nodes."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.filter.plan import choose_nodes

DOCUMENTATION = r"""
name: choose_nodes
author: torchherd developers
version_added: 0.1.0
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
options:
  _input:
    description: The plan (C(torchherd_plan)).
    type: dict
    required: true
  gate:
    description: The verdict of C(torchherd.cluster.gate) on the plan's nodes and spares.
    type: dict
    required: true
  groups:
    description: The inventory's C(groups).
    type: dict
    required: true
  hostvars:
    description: The inventory's C(hostvars).
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


class FilterModule:
    """torchherd spare-node filters."""

    def filters(self):
        return {"choose_nodes": choose_nodes}
