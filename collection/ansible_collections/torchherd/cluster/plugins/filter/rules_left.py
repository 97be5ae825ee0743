# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The nodes of a launch whose firewall rules are still in place once their job has ended."""

from __future__ import annotations

import json
import os

from ansible_collections.torchherd.cluster.plugins.filter.node_results import gang_lost

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
  - Where the start opened the rules, the job's supervisor removed them when the job ended on
    the node and wrote what it did to C(firewall.json) in the node's run directory; a node the
    watch did not wait on (it waited on the master alone) counts as clean when the copy of that
    file that collect brought back (under O(nodes_dir)) names no error.
  - A node lost by the watch, or by the master's gang (C(gang_lost) of the watch's wait on the
    master), is left out too; it keeps its rules until stop or collect of the run id reach it.
  - Once for all nodes on the controller, instead of a condition on a teardown task that
    would cost a worker per node even where it skips.
positional: _input, hostvars
options:
  nodes_dir:
    description: The run's C(nodes) directory on the controller, where collect put each node's
      run directory (C(<runs_dir>/<run_id>/nodes)); empty reads none.
    type: str
    default: ""
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
  loop: "{{ ansible_play_hosts | torchherd.cluster.rules_left(hostvars, nodes_dir=torchherd_plan.job.runs_dir ~ '/' ~ torchherd_plan.run_id ~ '/nodes') }}"
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


def _closed(hv, removed):
    watch = _plain(hv.get("torchherd_watch"))
    if "firewall" in watch:
        return "error" not in _plain(watch["firewall"])
    return removed is not None and "error" not in removed


def _removed_by_supervisor(nodes_dir, host):
    """The node's firewall.json as collect brought it back, or None."""
    if not nodes_dir:
        return None
    try:
        with open(os.path.join(nodes_dir, host, "firewall.json"), encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def rules_left(hosts, hostvars, nodes_dir=""):
    left = []
    lost = gang_lost(hosts, hostvars)
    for host in hosts:
        hv = hostvars.get(host, {})
        if _plain(hv.get("torchherd_watch")).get("unreachable") or host in lost:
            continue
        if _untouched(hv) or _closed(hv, _removed_by_supervisor(nodes_dir, host)):
            continue
        left.append(host)
    return left


class FilterModule:
    """torchherd firewall filters."""

    def filters(self):
        return {"rules_left": rules_left}
