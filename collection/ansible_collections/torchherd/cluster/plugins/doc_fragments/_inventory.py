# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The inventory's options of the filters that plan the nodes (the plan and the choice of nodes
after preflight): both take the inventory as Ansible hands it to a template.

Private to the collection (leading underscore): free to change. A filter states in its own
options only what it reads of them beyond this (its own description wins).
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  groups:
    description: The inventory's C(groups).
    type: dict
    required: true
  hostvars:
    description: The inventory's C(hostvars).
    type: dict
    required: true
"""
