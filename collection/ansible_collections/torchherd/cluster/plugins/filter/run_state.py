# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Every node's run-state record as the controller knows it: the newest of the copies it has."""

from __future__ import annotations

import json
import os

from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    RECORD,
    empty,
    rules_open,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._answers import answer

DOCUMENTATION = r"""
name: run_state
author: torchherd developers
version_added: 0.2.0
short_description: Read each node's run-state record (job, barrier, gang, firewall) on the controller
description:
  - Each node keeps one record of its part of a run (C(run.json) in its run directory, written
    by the start, the job's supervisor, the wait and the stop; see C(_runstate)). Every answer of
    M(torchherd.cluster.torchrun_job) carries a copy (C(record)), and collect brings the file
    back (under O(nodes_dir)); the newest copy of each node wins (its C(seq)).
  - The firewall role's M(torchherd.cluster.firewall_rules) writes what it opened under become
    into the same record (its C(run_dir)) and answers with a copy (C(torchherd_firewall)'s
    C(record)), which counts as the others do.
  - Adds what the controller alone knows, once for all nodes, so that no play deduces it from
    registered results, C(lost) (no answer over SSH, or named lost by the master's gang, whose
    record says which nodes it lost) and C(rules_open), the firewall rules still in place, as
    the record has them (opened by the start or by the firewall role). Where the record does
    not say what the role opened (the role was given no C(run_dir), or its module failed), the
    role's result C(torchherd_firewall) says it; a node that the plan gives no firewall
    (C(torchherd_node)), or whose start opened the rules itself (its answer C(torchherd_start)
    says so), has none of the role's; where nothing is known of a node's rules, C(rules_open)
    says so (the single rule C(unknown)), so that the teardown visits it.
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
  nodes_dir:
    description: The run's C(nodes) directory on the controller, where collect put each node's
      run directory (C(<runs_dir>/<run_id>/nodes)); empty reads none.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Find the nodes whose firewall rules are still in place
  ansible.builtin.add_host:
    name: "{{ item.key }}"
    groups: torchherd_teardown
  loop: >-
    {{ ansible_play_hosts | torchherd.cluster.run_state(hostvars, nodes_dir=runs_dir ~ '/nodes')
       | dict2items | selectattr('value.rules_open') | rejectattr('value.lost') }}
"""

RETURN = r"""
_value:
  description: Host name to its state.
  type: dict
  contains:
    record:
      description: The node's newest record (sections C(job), C(barrier), C(gang), C(firewall)).
      type: dict
    rules_open:
      description: The run's firewall rules the node still holds, as far as the controller knows.
      type: list
      elements: str
    lost:
      description: Whether the launch lost the node (the watch's SSH, or the master's gang).
      type: bool
    lost_why:
      description: Why it counts as lost (empty when it does not).
      type: str
    lost_at:
      description: When the master's gang saw the node's link close, on the clock of the node
        whose record says so (C(lost_seen_by)); null where the gang did not lose it.
      type: float
    lost_seen_by:
      description: The node (the master) whose record holds C(lost_at).
      type: str
"""

# The registered results of the launch's phases that answer with a copy of the record.
RESULTS = ("torchherd_start", "torchherd_watch", "torchherd_stop", "torchherd_status")
# And the firewall role's, which carries a copy where it wrote the record (not a phase of the
# job: its unreachable host is not a node lost while its job ran).
COPIES = ("torchherd_firewall",) + RESULTS
UNKNOWN = "unknown"


def _plain(value):
    return value if isinstance(value, dict) else {}


def _collected(nodes_dir, host):
    if not nodes_dir:
        return None
    try:
        with open(os.path.join(nodes_dir, host, RECORD), encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def newest(copies):
    """The copy with the highest seq (a later copy wins a tie)."""
    best = None
    for copy in copies:
        if isinstance(copy, dict) and (best is None or int(copy.get("seq") or 0)
                                       >= int(best.get("seq") or 0)):
            best = copy
    return best


def _role_rules(hv):
    """The rules the firewall role opened (None: the role's result is not known)."""
    if "torchherd_firewall" not in hv:
        # The role ended on this node before its task (its first, a meta task): the plan gives
        # the node no firewall, or the start opened the rules itself (its answer says so, and
        # the record holds what it opened).
        node_firewall = _plain(_plain(hv.get("torchherd_node")).get("firewall"))
        if (node_firewall and not node_firewall.get("enabled")) \
                or "firewall" in answer(hv, "torchherd_start"):
            return []
        return None
    role = _plain(hv["torchherd_firewall"])
    if role.get("skipped"):
        return []
    if role.get("failed"):
        return [UNKNOWN]
    return list(role.get("rules") or [])


def run_state(hosts, hostvars, nodes_dir=""):
    records = {}
    for host in hosts:
        hv = hostvars.get(host, {})
        copies = [answer(hv, key).get("record") for key in COPIES]
        records[host] = newest(copies + [_collected(nodes_dir, host)])
    gang_lost = {name for rec in records.values() if rec
                 for name in (_plain(rec.get("gang")).get("lost") or [])}
    # When the master saw each one go, on its clock (its host: whose clock it is).
    lost_at = {name: (host, when) for host, rec in records.items() if rec
               for name, when in (_plain(_plain(rec.get("gang")).get("lost_at"))).items()}
    out = {}
    for host in hosts:
        hv = hostvars.get(host, {})
        record = records[host] or empty()
        if _plain(record.get("firewall")).get("opened_by") == "role":
            # The role wrote what it opened, and the removals write theirs: the record alone.
            rules = rules_open(record)
        else:
            role = _role_rules(hv)
            if role is None and not record.get("firewall"):
                rules = [UNKNOWN]
            else:
                rules = (role or []) + rules_open(record)
        why = ""
        unreachable = [key for key in RESULTS if answer(hv, key).get("unreachable")]
        if unreachable:
            why = f"no answer over SSH ({unreachable[0].replace('torchherd_', '')})"
        elif host in gang_lost:
            why = "its link to the master's gang closed without its launcher's end"
        seen = lost_at.get(host) if host in gang_lost else None
        out[host] = {"record": record, "rules_open": rules, "lost": bool(why), "lost_why": why,
                     "lost_at": seen[1] if seen else None, "lost_seen_by": seen[0] if seen else None}
    return out


class FilterModule:
    """torchherd run-state filter."""

    def filters(self):
        return {"run_state": run_state}
