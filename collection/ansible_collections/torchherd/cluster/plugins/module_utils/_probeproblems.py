# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What the barrier (see _probe) says where pairs of the job's nodes could not connect: each
pair a problem in the template of the gate's table, and all of them in one message."""

from __future__ import annotations


def problem(host, check, expected, found, fix):
    """One problem in the template the gate's table uses."""
    return {"host": host, "check": check, "expected": str(expected), "found": str(found),
            "fix": fix}


def pair_problem(node, source, peer, address, port, error):
    """Why `node` (at its job interface's address `source`) could not connect to `peer` at
    address:port, the port `peer` listened on during the barrier."""
    return problem(
        f"{node} -> {peer}", "peers reachable",
        f"a TCP connection from {node} ({source}) to {peer} at {address}:{port}, a port the "
        f"kernel picked on {peer}'s job interface, as gloo and NCCL connect every node to every "
        f"other",
        error,
        f"allow TCP from {source} to {address} on any port (the job's firewall: mode members "
        f"lets the job's nodes in; mode ports needs the ports gloo and NCCL are pinned to), "
        f"check the route between them both ways, or name interfaces of {node} and {peer} that "
        f"reach each other (torchherd_socket_ifname)")


# The check of a node that would not start: its facts changed since the launch the start's
# arguments were computed for (a relaunch's start in its facts call, see _relaunch).
REFUSED = "facts unchanged"


def refused_problem(node):
    """Why the start was called off where `node` refused to start."""
    return problem(node, REFUSED,
                   "the node's facts as the last launch's preflight judged them",
                   "they changed (the node's own answer names which)",
                   "none needed: the launch judges the fresh facts and starts again")


def describe(problems, most=5):
    """Problems in one message, each as "host: check: expected ...; found ...; fix: ...",
    the first `most` of them."""
    said = []
    for p in problems[:most]:
        said.append(f"{p['host']}: {p['check']}: expected {p['expected']}; found {p['found']}; "
                    f"fix: {p['fix']}")
    if len(problems) > most:
        said.append(f"and {len(problems) - most} more")
    return " | ".join(said)


def called_off(problems):
    """What every node says where the pairs called the start off."""
    return f"the start was called off on every node: {describe(problems)}"
