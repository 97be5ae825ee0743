# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The nodes of a launch whose firewall rules are still in place once their job has ended."""

from __future__ import annotations

DOCUMENTATION = r"""
name: rules_left
author: torchherd developers
version_added: 0.1.0
short_description: List the nodes that still hold the run's firewall rules after the watch
description:
  - Reads C(torchherd_firewall) (the firewall role's result), C(torchherd_start) and
    C(torchherd_watch) from each host's variables.
  - A node holds no rule of the run when the firewall role added none (phase off, no active
    firewall, backend none) and the start opened none either, or when its last wait removed the
    rules the start opened.
  - A node lost by the watch is left out too; it keeps its rules until stop or collect of the
    run id reach it.
  - Once for all nodes on the controller, instead of a condition on a teardown task that
    would cost a worker per node even where it skips.
positional: _input, hostvars
options:
  _input:
    description: The hosts of the run.
    type: list
    elements: str
    required: true
  hostvars:
    description: C(hostvars).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Find the nodes whose firewall rules are still in place
  ansible.builtin.add_host:
    name: "{{ item }}"
    groups: torchherd_teardown
  loop: "{{ ansible_play_hosts | torchherd.cluster.rules_left(hostvars) }}"
"""

RETURN = r"""
_value:
  description: The hosts, in input order, whose rules a teardown must remove.
  type: list
  elements: str
"""


def _plain(value):
    return value if isinstance(value, dict) else {}


def _untouched(hv):
    if "torchherd_firewall" not in hv:
        return False
    role = _plain(hv.get("torchherd_firewall"))
    role_added = not role.get("skipped") and (
        bool(role.get("failed")) or len(role.get("rules", ["?"]) or []) > 0)
    start = _plain(hv.get("torchherd_start"))
    opened = _plain(start["firewall"]) if "firewall" in start else {"rules": []}
    return not role_added and len(opened.get("rules", ["?"]) or []) == 0


def _closed(hv):
    watch = _plain(hv.get("torchherd_watch"))
    return "firewall" in watch and "error" not in _plain(watch["firewall"])


def rules_left(hosts, hostvars):
    left = []
    for host in hosts:
        hv = hostvars.get(host, {})
        if _plain(hv.get("torchherd_watch")).get("unreachable"):
            continue
        if _untouched(hv) or _closed(hv):
            continue
        left.append(host)
    return left


class FilterModule:
    """torchherd firewall filters."""

    def filters(self):
        return {"rules_left": rules_left}
