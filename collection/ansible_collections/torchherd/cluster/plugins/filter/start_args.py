# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A node's start arguments (plugin_utils/_node_args.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.plugin_utils._node_args import (
    start_args as _start_args,
)

DOCUMENTATION = r"""
name: start_args
author: torchherd developers
version_added: 0.3.0
short_description: The arguments of a node's start, from the plan, the schedule and the gate
description:
  - What a node's start (M(torchherd.cluster.torchrun_job), O(torchherd.cluster.torchrun_job#module:state=started))
    is told - its launcher, script, ranks, master, barrier, environment, image, firewall rules
    and the launcher started ahead - from the plan, the schedule, the gate's verdict and the
    node's own entry and facts. The start task hands the answer on whole, as the module's
    O(torchherd.cluster.torchrun_job#module:arguments), one filter call per node in place of
    some sixty Jinja templates compiled in each worker.
  - The job's secret values are not among them; the task names the variable that holds them
    (O(torchherd.cluster.torchrun_job#module:secret_env_var)).
positional: _input, schedule, gate, node, facts, host
extends_documentation_fragment:
  - torchherd.cluster._node_values
  - torchherd.cluster._node_values.ARGUMENTS
options:
  gate:
    description: Preflight's verdict (C(torchherd_gate)) - process counts, the master port,
      the interfaces, the backend, the environment it derived per node.
    type: dict
    required: true
  facts:
    description: Preflight's facts of the node (C(torchherd_facts)).
    type: dict
    required: true
  firewall:
    description: Whether the start opens the node's firewall rules in its own round trip
      (C(torchherd_torchrun_firewall)).
    type: bool
    default: false
  grace:
    description: Seconds between SIGTERM and SIGKILL when the job is stopped.
    type: int
    default: 10
  slurm:
    description: Under spawn C(srun) only, C(srun) (the command), C(job_id) (the SLURM job) and
      C(node) (the node's name in it).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Start torchrun on every node
  torchherd.cluster.torchrun_job:
    secret_env_var: torchherd_job
    arguments: >-
      {{ torchherd_plan | torchherd.cluster.start_args(torchherd_schedule, torchherd_gate,
         torchherd_node, torchherd_facts, inventory_hostname) }}
"""

RETURN = r"""
_value:
  description:
    - The options of M(torchherd.cluster.torchrun_job) for the node's start, C(state) included.
    - C(standby) only where the schedule leaves restarts to torchrun, C(firewall) only where the
      start opens the rules, C(barrier) unless the schedule has none, C(container) only for a
      job in an image.
  type: dict
"""


def start_args(plan, schedule, gate, node, facts, host, firewall=False, grace=10, slurm=None):
    for name, value in (("plan", plan), ("schedule", schedule), ("gate", gate), ("node", node)):
        if not isinstance(value, dict):
            raise AnsibleFilterError(f"start_args: expected {name} as a dict, found {type(value).__name__}")
    return _start_args(plan, schedule, gate, node, facts or {}, host, firewall=bool(firewall),
                       grace=grace, slurm=slurm or {})


class FilterModule:
    """torchherd start filter."""

    def filters(self):
        return {"start_args": start_args}
