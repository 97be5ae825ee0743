# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The last launch of the same job on the same nodes, for a relaunch whose starts come with its
facts calls (the schedule's start.with_facts): found by the plan phase (action plan_run) in the
runs directory on the controller, where each launch leaves a pointer under the hash of its job.

The hash covers the plan but what differs from one launch to the next (the run id, the times,
the restart count) and the code's hash: the same job, the same nodes in the same order with the
same settings, the same code. The pointer names the last run of that job; its preflight.json
holds the gate's verdict and every node's facts. Only a verdict that passed counts."""

from __future__ import annotations

import hashlib
import json
import os

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic
from ansible_collections.torchherd.cluster.plugins.module_utils._relaunch import fingerprints
from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.disk import MIN_FREE_BYTES

# Under the runs directory: <hash of the job>.json, {"run_id": the last run of that job}.
POINTERS = ".relaunch"
# What of the plan differs from one launch of the same job to the next.
PER_LAUNCH = ("run_id", "started_at", "launched_at", "restart")
# What of the gate's verdict the starts are computed from (plugin_utils/_node_args, start_args).
GATE_KEYS = ("backend", "interfaces", "master_port", "node_env", "nproc_per_node", "nprocs")


def job_key(plan, code_hash):
    """The hash of the job as a relaunch repeats it."""
    same = {k: v for k, v in plan.items() if k not in PER_LAUNCH}
    same["job"] = {k: v for k, v in plan["job"].items() if k != "run_id"}
    text = json.dumps([same, code_hash], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def find(runs_dir, key, hosts):
    """The last launch of the job ``key`` on ``hosts`` whose preflight passed: run_id, the
    gate's verdict (GATE_KEYS), every node's facts and what a node's fresh facts must be
    (start_expect, by host); None where there is none."""
    pointer = _read(os.path.join(runs_dir, POINTERS, f"{key}.json")) or {}
    run_id = pointer.get("run_id")
    if not isinstance(run_id, str) or not run_id or os.sep in run_id:
        return None
    judged = _read(os.path.join(runs_dir, run_id, "preflight.json")) or {}
    gate, facts = judged.get("gate") or {}, judged.get("facts") or {}
    if not gate.get("ok") or any(k not in gate for k in GATE_KEYS):
        return None
    if not all(isinstance(facts.get(h), dict) and not facts[h].get("failed")
               and not facts[h].get("unreachable") for h in hosts):
        return None
    return {"run_id": run_id,
            "gate": {k: gate[k] for k in GATE_KEYS},
            "facts": {h: facts[h] for h in hosts},
            "expect": {h: {"facts": fingerprints(facts[h]), "min_free_bytes": MIN_FREE_BYTES}
                       for h in hosts}}


def point(runs_dir, key, run_id):
    """Make run ``run_id`` the last launch of the job ``key``."""
    os.makedirs(os.path.join(runs_dir, POINTERS), exist_ok=True)
    write_atomic(os.path.join(runs_dir, POINTERS, f"{key}.json"), json.dumps({"run_id": run_id}))
