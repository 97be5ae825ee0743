# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A node's facts-call arguments (plugin_utils/_node_args.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.plugin_utils._node_args import (
    facts_args as _facts_args,
)

DOCUMENTATION = r"""
name: facts_args
author: torchherd developers
version_added: 0.3.0
short_description: The arguments of a node's preflight facts call, from the plan and the schedule
description:
  - The arguments of M(torchherd.cluster.node_facts) on one node but its O(torchherd.cluster.node_facts#module:venv),
    computed in Python from the plan, the schedule, the code's hash and the node's plan entry,
    and handed to the task whole, as the module's O(torchherd.cluster.node_facts#module:arguments).
    Written as the task's own Jinja they were compiled and rendered again in every worker, one
    worker per node.
  - The venv stays the task's own argument, since the task reads the job's lock file on the
    controller, and only where the node has a venv.
extends_documentation_fragment:
  - torchherd.cluster._node_values
  - torchherd.cluster._node_values.ARGUMENTS
positional: _input, schedule, node, code, host, cache_seconds
options:
  code:
    description: The job's code as the plan hashed it (C(torchherd_code), C(files) and C(hash));
      empty where the run has none.
    type: dict
    required: true
  cache_seconds:
    description: How long the node's cached torch probe is trusted (C(torchherd_preflight_cache_s)).
    type: int
    required: true
  prior:
    description:
      - The last launch of the same job on the same nodes whose preflight passed, as the plan
        phase found it (M(torchherd.cluster.plan_run)'s RV(torchherd.cluster.plan_run#module:prior),
        C(torchherd_prior)); null where there is none.
      - Where the schedule has the start come with the facts call (C(start.with_facts)), the
        start's arguments are computed from its verdict and this node's facts then, as filter
        C(torchherd.cluster.start_args) computes them.
    type: dict
  grace:
    description: Seconds between SIGTERM and SIGKILL for that start (C(torchherd_torchrun_grace)).
    type: float
"""

EXAMPLES = r"""
- name: Gather node facts
  torchherd.cluster.node_facts:
    venv: {}
    arguments: >-
      {{ torchherd_plan | torchherd.cluster.facts_args(torchherd_schedule | default({}),
         torchherd_node, torchherd_code | default({}), inventory_hostname, 86400) }}
"""

RETURN = r"""
_value:
  description:
    - The options of M(torchherd.cluster.node_facts) for the node but its venv - C(python),
      C(root), C(port), C(pick_port), C(cache_seconds), C(code_dir), C(code_files),
      C(code_expect), C(master_addr), C(interface), C(container) and C(warm).
    - C(port) is the master port where the node is the master or spares may make it one (0
      elsewhere, or where the port is C(auto)); C(pick_port) where the master picks a free one;
      C(warm) asks for the launcher to start ahead where the node's part of the schedule says
      so (RV(torchherd.cluster.node_schedule#filter:start_ahead)), else it is empty.
    - Where the schedule has the start come with the facts call, also C(start) (the start's
      arguments, as filter C(torchherd.cluster.start_args) returns them, from O(prior)),
      C(start_expect) (what the node's facts must be for it to go on) and, on the master of a
      job whose master port is C(auto), C(prefer_port) (the port the starts were computed for).
  type: dict
"""


def facts_args(plan, schedule, node, code, host, cache_seconds, prior=None, grace=None):
    for name, value in (("plan", plan), ("node", node)):
        if not isinstance(value, dict):
            raise AnsibleFilterError(f"facts_args: expected {name} as a dict, found {type(value).__name__}")
    return _facts_args(plan, schedule or {}, node, code or {}, host, cache_seconds, prior=prior,
                       grace=grace)


class FilterModule:
    """torchherd facts filter."""

    def filters(self):
        return {"facts_args": facts_args}
