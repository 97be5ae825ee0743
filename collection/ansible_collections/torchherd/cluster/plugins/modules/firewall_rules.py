#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: firewall_rules
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: Let one job's nodes reach each other through the node's firewall, and nobody else
description:
  - Allows TCP from the job's other nodes (O(peers)) only, never from anywhere; O(mode=members)
    allows any TCP port, O(mode=ports) only O(ports). The rules belong to one run (O(run_id));
    runs sharing a node never touch each other's rules, and O(state=absent) removes exactly
    the run's rules, wherever they are.
  - O(backend=auto) looks at what is active on the node and puts the rules in every firewall
    that could drop the job's packets, since a packet has to pass them all. firewalld (when
    running) or else ufw (when active) manage the firewall and get the rules in their own terms;
    the iptables rules are theirs then. nftables gets them where a table of the administrator's
    own has an input chain that can drop; iptables where INPUT can drop and neither firewalld
    nor ufw runs. Where nothing filters, nothing changes, and RV(msg) says so.
  - With nftables, one rule per address family at the head of every filter chain on the input hook
    that can drop (a drop policy, or a drop, reject, jump, goto or queue rule), in the
    administrator's own tables, with the comment C(torchherd:<run>:<fingerprint>). A table of
    torchherd's own could not do it, since an accept in one table does not stop the packet
    from being judged, and dropped, by the base chains of the others. Tables of iptables-nft
    are left to the iptables backend.
  - With iptables (and ip6tables for IPv6 peers), a chain C(th-<run>) of the run's own, jumped to from
    the head of INPUT by a rule with the comment C(torchherd:<run>); changed in one
    C(iptables-restore --noflush) each.
  - With ufw, C(ufw allow proto tcp from PEER to any [port PORTS] comment torchherd:<run>). ufw keeps
    a single rule for identical specs, so runs that need the same rule share it; the comment
    lists them all, and the last one to leave deletes it. A rule the administrator made is
    never changed.
  - With firewalld, rich rules (C(rule family=... source address=PEER ... accept)) in the zone that
    receives each peer's traffic (a zone with a matching source, else the zone of the interface
    that routes to the peer, else the default zone). Rich rules carry no comment; a ledger per
    run under C(/var/lib/torchherd/firewall) records which rules the run needs and whether a
    run added them, so that only those are removed, and only by the last run that needs them.
  - Runs that change the firewall of one node at the same time wait for each other (a lock
    in C(/run)).
  - With O(run_dir), what was opened or removed goes into the node's run-state record of the
    run (C(run.json) there, section C(firewall)), where the controller and the job's own
    removers read it, and RV(record) returns it.
notes:
  - Needs root (C(become)). All commands run as argument lists, never through a shell.
  - Rules apply to TCP on the input hook. Filtering elsewhere (an nftables prerouting or
    netdev ingress chain, a cloud security group, a firewall between the nodes) is not seen.
    RDMA traffic (InfiniBand, RoCE) bypasses the host firewall and needs nothing here.
  - Reloading the firewall from its configuration (C(nft -f /etc/nftables.conf) with
    C(flush ruleset), C(firewall-cmd --reload), C(ufw reload)) drops the runtime rules of a
    running job, except ufw's and permanent ones. Apply again to put them back.
  - O(peers) are source addresses as the node sees them. Behind NAT, or when the job's
    traffic leaves the peers from another address than the one given, widen O(peers)
    (networks are accepted).
extends_documentation_fragment:
  - torchherd.cluster._attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: Before and after list the run's rules on the node, one line each.
  idempotent:
    support: full
    details: Applying the same rules again changes nothing and reports no change.
options:
  state:
    description: C(present) makes the run's rules exactly what the options ask for; C(absent) removes them.
    type: str
    choices: [present, absent]
    default: present
  run_id:
    description: The run the rules belong to (letters, digits, C(.), C(_), C(-)).
    type: str
    required: true
  peers:
    description:
      - Addresses (or networks, or names resolved on the node) of the job's other nodes; traffic
        from them is allowed, from nowhere else. No peers means no rules.
    type: list
    elements: str
    default: []
  mode:
    description:
      - C(members) allows any TCP port from the peers (what torchrun, gloo and NCCL need, since they
        listen on random ports).
      - C(ports) allows only O(ports); gloo and NCCL then need their ports pinned, see the role's
        documentation.
    type: str
    choices: [members, ports]
    default: members
  ports:
    description: With O(mode=ports), the TCP ports and ranges to allow (C(29500), C(40000-40100)).
    type: list
    elements: str
    default: []
  backend:
    description:
      - Where the rules go; C(auto) detects it (see the description), C(none) changes nothing.
      - With O(state=absent) and C(auto), the run's rules are removed from every backend present.
    type: str
    choices: [auto, nftables, ufw, firewalld, iptables, none]
    default: auto
  persistent:
    description:
      - Keep the rules across a reboot (until O(state=absent)). firewalld gets permanent rules as
        well; nftables and iptables rules are loaded at boot by a oneshot systemd unit
        C(torchherd-firewall-<run>.service) from files in C(/etc/torchherd/firewall).
      - ufw has no runtime-only rules; ufw rules survive a reboot either way, and a warning
        says so.
    type: bool
    default: false
  run_dir:
    description:
      - The run's directory on the node (C(<root>/runs/<run_id>), the job user's, an absolute
        path since C(~) would be the home of the user the module runs as, root with become).
      - With O(state=present), the rules the module opened go into the directory's run-state
        record (C(opened_by) C(role), C(rules), C(backends)), made where the start has not made
        it yet. With O(state=absent), the removal (C(closed_by) C(teardown), C(changed),
        C(removed), C(error), also where it failed) goes there, where the directory exists and
        the removal says something the record does not (a removal that found nothing leaves a
        record whose rules are already gone as it is).
      - Files the module makes there as root belong to the directory's owner, so that the
        job's own writers go on writing the record. Not written in check mode.
      - Empty writes no record.
    type: path
    default: ""
"""

EXAMPLES = r"""
- name: Allow the job's traffic from the two other nodes
  torchherd.cluster.firewall_rules:
    run_id: 20261121-105606-985c
    peers: [10.0.0.2, 10.0.0.3]

- name: Allow only the master port and a pinned range for gloo/NCCL
  torchherd.cluster.firewall_rules:
    run_id: 20261121-105606-985c
    peers: [10.0.0.2, 10.0.0.3]
    mode: ports
    ports: ["29500", "50000-50999"]

- name: Remove the run's rules
  torchherd.cluster.firewall_rules:
    state: absent
    run_id: 20261121-105606-985c

- name: Allow the job's traffic, and say so in the run's record (the job runs as alice)
  torchherd.cluster.firewall_rules:
    run_id: 20261121-105606-985c
    peers: [10.0.0.2]
    run_dir: /home/alice/.torchherd/runs/20261121-105606-985c
  become: true
"""

RETURN = r"""
backends:
  description: The backends that hold (or, with O(state=absent), held) the run's rules; empty where no firewall is active.
  returned: always
  type: list
  elements: str
  sample: [nftables]
detected:
  description: What was found on the node, per backend; empty with O(backend=none).
  returned: always
  type: dict
  sample: {nftables: active, iptables: inactive, ufw: missing, firewalld: missing}
rules:
  description: The run's rules on the node afterwards (in check mode, as they would be), one line each.
  returned: always
  type: list
  elements: str
  sample: ['nftables inet filter input: ip saddr { 10.0.0.2 } meta l4proto tcp accept comment "torchherd:run-1:2f1c0a9e"']
peers:
  description: The peer addresses after resolving names, IPv4 then IPv6.
  returned: always
  type: list
  elements: str
  sample: [10.0.0.2, 10.0.0.3]
record:
  description:
    - The run-state record of O(run_dir) after this call (see M(torchherd.cluster.torchrun_job)'s
      C(record)); the controller takes the newest copy of a node's record (filter
      C(torchherd.cluster.run_state)).
  returned: where O(run_dir) was written
  type: dict
  sample:
    schema: 1
    seq: 1
    firewall:
      opened_by: role
      rules: ['nftables inet filter input: ip saddr { 10.0.0.2 } meta l4proto tcp accept comment "torchherd:run-1:2f1c0a9e"']
      backends: [nftables]
msg:
  description: What happened, in one line.
  returned: always
  type: str
  sample: "nftables: 0 rule(s) before, 1 after"
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchherd.cluster.plugins.module_utils._exit import skip_last_collection
from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import (
    RULE_OPTIONS,
    FirewallError,
    Runner,
    converge_rules,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    read_record,
    rules_closed,
    rules_open,
    rules_opened,
    write,
)


def note(p, result):
    """What this call opened or removed, into the run's record (p["run_dir"]); the record
    afterwards, or None where there was nothing to write."""
    paths = {"dir": p["run_dir"]}
    if p["state"] == "present":
        # A removal written before (an earlier launch of the run id) no longer holds.
        return write(paths, "firewall", closed_by=None, changed=None, error=None,
                     **rules_opened("role", result))
    if not os.path.isdir(paths["dir"]):
        return None  # the run never came to this node: no directory made for a removal
    before = read_record(paths)
    if not (result.get("changed") or result.get("error") or rules_open(before)):
        return None  # the record has the rules gone already (the supervisor, the wait)
    diff = result.get("diff") or {}
    after = set((diff.get("after") or "").splitlines())
    removed = [line for line in (diff.get("before") or "").splitlines() if line not in after]
    return write(paths, "firewall", removed=removed, **rules_closed("teardown", result))


def main():
    skip_last_collection()
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="present", choices=["present", "absent"]),
            run_id=dict(type="str", required=True),
            run_dir=dict(type="path", default=""),
            **RULE_OPTIONS,
        ),
        supports_check_mode=True,
    )
    p = module.params
    recorded = p["run_dir"] and not module.check_mode
    try:
        result = converge_rules(Runner(module), p)
    except FirewallError as exc:
        if recorded and p["state"] == "absent":
            # The rules may still be there: the record keeps them open for a later teardown.
            _note(module, {"changed": False, "error": exc.msg})
        module.fail_json(msg=exc.msg, **exc.details)
    if recorded:
        record = _note(module, result)
        if record is not None:
            result["record"] = record
    module.exit_json(**result)


def _note(module, result):
    """note, where a record that cannot be written is a warning: the firewall changed, and the
    result says how (the controller reads it where no record says more)."""
    try:
        return note(module.params, result)
    except OSError as exc:
        module.warn(f"the run's record in {module.params['run_dir']} was not written: {exc}")
        return None


if __name__ == "__main__":
    main()
