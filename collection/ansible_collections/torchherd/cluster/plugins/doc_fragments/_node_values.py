# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The values of the launch and of one node that the filters of a node's part take
(node_schedule, facts_args, start_args), and the option through which a module takes such a
filter's answer whole (node_facts, torchrun_job).

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

    # The modules' option that takes a filter's answer whole (node_facts, torchrun_job).
    SPREAD = r"""
options:
  arguments:
    description:
      - Any of the module's other options as one mapping, which the collection's action for the
        module spreads into its arguments; an option given on its own wins.
      - A launch passes a node's answer of filter C(torchherd.cluster.facts_args) (preflight's
        facts call) or C(torchherd.cluster.start_args) (the start) here, whole. Through the
        task's C(args) keyword instead, a template makes ansible-core warn that it is unsafe,
        on every launch.
    type: dict
    default: {}
"""
