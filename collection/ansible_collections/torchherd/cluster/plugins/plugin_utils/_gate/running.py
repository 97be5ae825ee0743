# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What already runs on the nodes in the job's way: a run of its run id, a listener on the
master port; and the master port of a job that lets the master pick it (auto)."""

from __future__ import annotations

import posixpath

from ansible_collections.torchherd.cluster.plugins.plugin_utils._gate.common import problem


def run_id_free(host, f, plan):
    """No run of this run id is alive under the node's root. (Not under another root: nodes of
    one machine - the local inventory - each have theirs, and see each other's processes; the
    launcher started ahead on one (the schedule's start.warm) is no run on the others.)"""
    own = posixpath.normpath(posixpath.join(str(f.get("root") or ""), "runs", plan["run_id"]))
    return [problem(host, "run id", f"run {plan['run_id']} not running",
                    f"running as pids {pids}",
                    "a run id starts once: stop it (playbooks/stop.yml) "
                    "or launch with another run id")
            for run_dir, pids in (f.get("running_jobs") or {}).items()
            if posixpath.normpath(run_dir) == own]


def with_master_port(plan, facts):
    """The plan with its master port as the launch uses it: the job's own, or where the job
    says auto, the free port the master picked in preflight (its facts' port_picked; None
    until it answered)."""
    master = plan["master"]
    if master["port"] != "auto":
        return plan
    picked = (facts.get(master["host"]) or {}).get("port_picked")
    return {**plan, "master": {**master, "port": picked}}


def master_port(facts, plan):
    """The master port free on the master: the job's, checked; or one the master picked."""
    master = plan["master"]["host"]
    if master not in facts:
        return []
    if plan["master"]["port"] is None:
        return [problem(master, "master port", "a free port picked on the master "
                        "(master_port auto)", "none could be bound",
                        "free ports on the master (ss -ltn lists those in use), or set "
                        "torchherd_job.master_port to a free port")]
    if facts[master].get("port_free") is not False:
        return []
    return [problem(master, "master port", f"port {plan['master']['port']} free on the master",
                    "in use by another process",
                    "stop what listens there (ss -ltnp sport = :PORT), set "
                    "torchherd_job.master_port to a free port, or to auto (a free one picked "
                    "on the master)")]


def checks(run):
    return master_port(run.facts, run.plan)


NODE_CHECKS = (run_id_free,)
CHECKS = (checks,)
