# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The interconnect check's verdict: the measure between the nodes, judged (module_utils'
_interconnect) on the controller."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._interconnect import judge


def interconnect_verdict(hosts, hostvars, job, facts):
    """The interconnect check's verdict (see _interconnect.judge) with every node's result;
    None where it did not run. The results are each node's C(torchherd_interconnect), or the
    measure of the same nodes that the preflight role reused (C(torchherd_interconnect_reused),
    which the role sets on every node of the play; localhost's is still read, as before)."""
    reused = (hostvars.get("localhost") or {}).get("torchherd_interconnect_reused") or {}
    for host in hosts:
        # The role sets the same value on every node, so the first node that has one answers.
        reused = reused or hostvars.get(host, {}).get("torchherd_interconnect_reused") or {}
    results = dict(reused.get("results") or {})
    if not results:
        for host in hosts:
            found = hostvars.get(host, {}).get("torchherd_interconnect")
            if isinstance(found, dict) and not found.get("skipped"):
                keys = ("allreduce", "pairs", "error", "seconds")
                results[host] = {k: found.get(k) for k in keys}
                if not found.get("allreduce") and not found.get("error"):
                    results[host]["error"] = str(found.get("msg") or "no result")[:300]
        if not results:
            return None
    speeds = {h: (f.get("interface") or {}).get("speed") for h, f in facts.items()}
    verdict = judge(hosts, results, job.get("interconnect_min_busbw") or 0.0,
                    job.get("interconnect_min_link_share") or 0.0, speeds)
    verdict["results"] = results
    verdict["reused"] = {"run_id": reused.get("run_id"), "at": reused.get("at")} \
        if reused.get("results") else None
    return verdict
