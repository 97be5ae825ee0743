# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A node's part of the launch: the schedule's decisions that need what preflight learnt of the
node, or what its start did (plugin_utils/_schedule, NODE_DECISIONS)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.plugin_utils._schedule.nodes import (
    Node,
    decide_node,
)

DOCUMENTATION = r"""
name: node_schedule
author: torchherd developers
version_added: 0.3.0
short_description: Decide a node's part of the launch from the schedule and the node's facts
description:
  - The decisions of how a launch runs that depend on one node (whether its launcher starts
    ahead, never a spare's), on what preflight learnt of it (whether its job runs as root,
    whether its launcher was started ahead) or on what its start did (the rules it opened).
    Each is a function of the schedule (C(torchherd.cluster.schedule))
    and that node's values, in the same table as the schedule's own decisions
    (C(plugin_utils/_schedule/nodes.py), C(NODE_DECISIONS)); the plays pass the node's
    values in and read the answer.
extends_documentation_fragment:
  - torchherd.cluster._node_values
positional: _input, node, facts, started
options:
  _input:
    description: The launch's schedule (C(torchherd_schedule)).
    type: dict
    required: true
  facts:
    description: Preflight's facts of the node (C(torchherd_facts)); empty before preflight.
    type: dict
    default: {}
  started:
    description: The start's answer on the node (C(torchherd_start)); empty before the start.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Open the node's rules in the start where the node's part says so
  ansible.builtin.set_fact:
    torchherd_torchrun_firewall: >-
      {{ (torchherd_schedule | torchherd.cluster.node_schedule(torchherd_node, torchherd_facts)).firewall == 'start' }}
"""

RETURN = r"""
_value:
  description: The node's part of the launch.
  type: dict
  contains:
    firewall:
      description: Who opens the node's firewall rules, C(start) (the start, in its own round
        trip, where the schedule's C(firewall.start_opens) holds and the job runs as root
        there), C(role) (the firewall role, before the start) or C(none) (the plan gives the
        node no firewall).
      type: str
    warm:
      description: Whether the start hands the job to the launcher preflight started ahead on
        the node (one started there, and the node's spawn is C(ssh)).
      type: bool
    wait_closes:
      description: Whether the wait that sees the job end on the node removes the rules its
        start opened.
      type: bool
    why:
      description: For each decision, in words, why it came out as it did.
      type: dict
"""


def node_schedule(schedule, node, facts=None, started=None):
    if not isinstance(schedule, dict) or "firewall" not in schedule or "spawn" not in schedule:
        raise AnsibleFilterError("node_schedule: expected the schedule (torchherd_schedule), "
                                 f"found {type(schedule).__name__}")
    return decide_node(schedule, Node(entry=dict(node or {}), facts=dict(facts or {}),
                                      started=dict(started or {})))


class FilterModule:
    """torchherd node schedule filter."""

    def filters(self):
        return {"node_schedule": node_schedule}
