# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""After preflight: the healthy nodes a job with spares runs on."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.job import standby_mode


def healthy_choice(plan_, gate_):
    """The nodes a job of ``plan_`` runs on after preflight's verdict ``gate_`` on every
    candidate (its nodes and spares), and {host: why} of those left out; None where the nodes
    cannot be chosen (a problem of no single node, too few healthy ones, or an unhealthy master
    the job names)."""
    nodes = [n["host"] for n in plan_["nodes"]]
    spares = [n["host"] for n in plan_.get("spares") or []]
    problems = {}
    for problem in gate_.get("problems") or []:
        host = problem.get("host")
        if host not in nodes and host not in spares:
            return None  # between two nodes, or the launch's own: no spare helps
        problems.setdefault(host, []).append(f"{problem['check']}: {problem['found']}")
    healthy = [s for s in spares if s not in problems]
    chosen = [n if n not in problems else (healthy.pop(0) if healthy else None) for n in nodes]
    chosen = [n for n in chosen if n]
    master = (plan_["job"].get("master") or "")
    if len(chosen) < plan_.get("min_nodes", len(nodes)) or (master and master not in chosen):
        return None
    # A detached job's restarts are torchrun's: the healthy spares left wait in its rendezvous.
    standbys = healthy if standby_mode(plan_["job"]) else []
    left_out = {h: "; ".join(problems[h]) for h in nodes + spares if h in problems}
    left_out.update({h: "a spare the job did not need" for h in spares
                     if h not in chosen and h not in problems and h not in standbys})
    return chosen + standbys, left_out, standbys
