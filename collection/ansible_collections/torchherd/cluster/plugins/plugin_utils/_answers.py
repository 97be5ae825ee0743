# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A node's registered answers as the controller's filters read them (a node's hostvars).

The start's answer is the start task's (torchherd_start) or, on a relaunch whose start came
with preflight's facts call (the schedule's start.with_facts), that call's (torchherd_facts'
``start``): where that start was called off and the launch took the full path, the start
task's answer is the later one and wins."""

from __future__ import annotations

START = "torchherd_start"
FACTS = "torchherd_facts"


def _plain(value):
    return value if isinstance(value, dict) else {}


def answer(hv, key):
    """The registered answer ``key`` of the node whose hostvars are ``hv``, {} where none."""
    value = _plain(hv.get(key))
    if key == START and not value:
        value = _plain(_plain(hv.get(FACTS)).get("start"))
    return value


def with_facts(hosts, hostvars):
    """Where the nodes' starts came with their facts calls (the schedule's start.with_facts), what
    became of them, for preflight.json: ``started`` (the job went on everywhere, the start task
    then does nothing), ``refused`` (host: why, each node that refused at the barrier) and
    ``called_off`` (what the barrier said where it called the start off); None elsewhere."""
    said = {h: _plain(_plain(hostvars.get(h, {}).get(FACTS)).get("start")) for h in hosts}
    said = {h: a for h, a in said.items() if a}
    if not said:
        return None
    probes = {h: _plain(a.get("probe")) for h, a in said.items()}
    return {"started": len(said) == len(hosts) and all(a.get("started") for a in said.values()),
            "refused": {h: p["refused_here"] for h, p in probes.items() if p.get("refused_here")},
            "called_off": next((p["error"] for h, p in probes.items()
                                if not said[h].get("started") and p.get("error")), None)}
