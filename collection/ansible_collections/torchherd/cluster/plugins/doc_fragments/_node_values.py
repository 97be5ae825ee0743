# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The values of the launch and of one node that the filters of a node's part take
(node_schedule, facts_args, start_args).

Private to the collection (leading underscore): free to change.
"""

from __future__ import annotations


class ModuleDocFragment:
    # The node, as the plan has it.
    DOCUMENTATION = r"""
options:
  node:
    description: The plan's entry of the node (C(torchherd_node)).
    type: dict
    required: true
"""

    # The plan as the filter's input, the launch's schedule and the node's inventory name: the
    # filters that work out a node's task arguments.
    ARGUMENTS = r"""
options:
  _input:
    description: The plan (C(torchherd_plan)).
    type: dict
    required: true
  schedule:
    description:
      - The launch's schedule (C(torchherd_schedule)).
      - C(torchherd.cluster.facts_args) takes an empty one where there is none (a verify without
        a job), and then asks for no launcher started ahead.
    type: dict
    required: true
  host:
    description: The node's inventory name.
    type: str
    required: true
"""
