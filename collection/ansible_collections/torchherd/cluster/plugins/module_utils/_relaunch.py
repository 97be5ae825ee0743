# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A relaunch's start in its facts call: what of a node's facts must be as the last launch's
preflight judged them for the start the controller computed from that judgement to hold.

The controller (the plan, plugin_utils) fingerprints each node's facts of the last launch
whose gate passed; the node (node_facts) fingerprints its fresh facts the same way and starts
only where the two agree. One function on both sides, so that they cannot drift.

Facts that change from one launch to the next by nature cannot be in the fingerprint as
values: the free disk is held to the gate's own threshold (sent with the fingerprint); the
launcher started ahead, the torch probe's cache flag and the jobs running on the node (the gate
asks them only whether the new run's id is taken, which the start checks itself; nodes that
share a machine see each other's launchers there) are left out; the code must be the
controller's (code_current); a master port picked (auto) is the one the starts were computed
for where it is still free (node_facts' prefer_port). Everything else the gate reads of a node
is in it: any change there (another torch, an address, a process on a GPU, a new Xid, the
master port taken, a reboot) and the node refuses; the launch then judges the fresh facts and
takes the full path. Runs on the nodes (Python 3.8 and later)."""

from __future__ import annotations

import hashlib
import json

# The facts of node_facts' answer that the fingerprint covers, each whole but torch's cache
# flag: every fact the gate reads of a node (plugin_utils/_gate) but those above.
FINGERPRINTED = (
    "hostname", "euid", "root", "venv", "container", "python", "torch",
    "cuda_visible_devices", "addresses", "interface", "port_free", "port_picked", "rsync",
    "py_spy", "gpu_processes", "xid", "boot_id", "shm_bytes", "memlock", "infiniband",
    "gpu_nics",
)


def _part(facts, key):
    value = facts.get(key)
    if key == "torch" and isinstance(value, dict):
        value = {k: v for k, v in value.items() if k != "cached"}
    return value


def fingerprints(facts):
    """Each fingerprinted fact's own digest (a short hex string), by name: the node names the
    facts that changed by comparing these."""
    return {key: hashlib.sha256(json.dumps(_part(facts, key), sort_keys=True, default=str)
                                .encode()).hexdigest()[:16]
            for key in FINGERPRINTED}


def changed(facts, expect):
    """Why the node must not start with the arguments computed for the facts that `expect`
    fingerprints (its ``facts``, fingerprints(); ``min_free_bytes``, the gate's threshold), in a
    few words; None where it may."""
    reasons = []
    if not facts.get("code_current"):
        reasons.append("the code on the node is not the controller's")
    mine = fingerprints(facts)
    theirs = expect.get("facts") or {}
    differ = [key for key in FINGERPRINTED if mine[key] != theirs.get(key)]
    if differ:
        reasons.append("changed since the last launch: " + ", ".join(differ))
    floor = int(expect.get("min_free_bytes") or 0)
    free = facts.get("disk_free_bytes")
    if floor and (free is None or free < floor):
        reasons.append(f"free disk {free} bytes, below the gate's {floor}")
    return "; ".join(reasons) or None
