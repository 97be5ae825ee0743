# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Each node's part of the schedule, once preflight has read it (NODE_DECISIONS): the
decisions that need a node's own facts or what its start did, answered by filter
torchherd.cluster.node_schedule. The launch's own decisions are in decisions.py."""

from __future__ import annotations

from typing import NamedTuple

# --- each node's part, once preflight has read it ------------------------------------------------
# What the launch's schedule leaves to a node's own facts: whether its job runs as root (its
# euid), whether its launcher was started ahead, what its start opened. Each is decided here, by
# the schedule's answer and that node's facts, never in a task file.


class Node(NamedTuple):
    """One node as the decisions below see it."""

    entry: dict  # the plan's entry of the node (torchherd_node)
    facts: dict  # preflight's facts of the node (torchherd_facts), empty before
    started: dict  # the start's answer on the node (torchherd_start), empty before


def node_firewall(s, n):
    """Who opens the node's rules: none where the plan gives it no firewall; the start, in its
    own round trip before the barrier, where the schedule lets it (firewall.start_opens) and the
    node's facts say the job runs as root (euid 0: no become to ask for); elsewhere the firewall
    role, before the start (under become where the node's firewall says so)."""
    if not (n.entry.get("firewall") or {}).get("enabled"):
        return "none", "the plan gives the node no firewall"
    if not s["firewall"]["start_opens"]:
        return "role", "the schedule has the firewall role open the rules before the start"
    if n.facts.get("euid") == 0:
        return "start", "the job runs as root here: the start opens the rules in its round trip"
    return "role", ("the job does not run as root here (euid "
                    f"{n.facts.get('euid', 'unknown')}): the firewall role opens the rules")


def node_start_ahead(s, n):
    """Preflight's facts call starts the node's launcher ahead where the schedule's start.warm
    holds, the node is one of the job's (a spare's turn is known only after preflight) and its
    launcher is spawned over ssh (under srun, a step of the node's SLURM job starts it)."""
    if not s["start"]["warm"]:
        return False, "the schedule starts no launcher ahead"
    if n.entry.get("node_rank") is None:
        return False, "a spare: whether it takes part is known only after preflight"
    spawn = s["spawn"].get(n.entry.get("host"), "ssh")
    if spawn != "ssh":
        return False, f"spawn {spawn}: the launcher starts as a step of the node's job"
    return True, "one of the job's nodes, spawned over ssh: its launcher starts in the facts call"


def node_warm(s, n):
    """The start hands the job to the launcher preflight started ahead on the node where one
    started there (its facts say so) and the node's launcher is spawned over ssh; under srun, a
    step of the node's SLURM job starts it anew."""
    started = bool((n.facts.get("warm") or {}).get("started"))
    spawn = s["spawn"].get(n.entry.get("host"), "ssh")
    if not started:
        return False, "no launcher was started ahead on the node"
    if spawn != "ssh":
        return False, f"spawn {spawn}: the launcher starts anew as a step of the node's job"
    return True, "the launcher started ahead on the node is handed the job"


def node_wait_closes(s, n):
    """A wait that sees the job end on the node removes the rules its start opened (the start's
    answer names them), with the firewall's own code: no teardown round trip for them."""
    rules = (n.started.get("firewall") or {}).get("rules") or []
    if rules:
        return True, f"the start opened {len(rules)} rule(s) here: the wait that sees the end removes them"
    return False, "the start opened no rule here"


# (the node schedule's entry, the decision). In the order they are made.
NODE_DECISIONS = (
    ("start_ahead", node_start_ahead),
    ("firewall", node_firewall),
    ("warm", node_warm),
    ("wait_closes", node_wait_closes),
)


def decide_node(s, n):
    """Each decision of NODE_DECISIONS for node ``n`` under schedule ``s``, with its reasons."""
    out, why = {}, {}
    for key, decision in NODE_DECISIONS:
        out[key], why[key] = decision(s, n)
    out["why"] = why
    return out
