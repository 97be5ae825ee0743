# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The start barrier, where the supervisor meets the other nodes' in the background, and this
node's place in the gang (_gang) once the barrier said go."""

from __future__ import annotations

import socket

from ansible_collections.torchherd.cluster.plugins.module_utils._gang import Master, Member
from ansible_collections.torchherd.cluster.plugins.module_utils._probe import barrier, bind
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import read_record
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.nodelog import say
from ansible_collections.torchherd.cluster.plugins.module_utils._use import (
    mean_util,
    point_cell,
)


def meeting_of(p):
    """What the supervisor needs for the barrier and the gang in the background."""
    b = p["barrier"]
    return {"master_addr": p["master_addr"], "master_port": p["master_port"],
            "run_id": p["run_id"], "listen": b["listen"], "expect": b["expect"],
            "timeout": b["timeout"], "window": b["window"], "source": b["source"] or None,
            "elastic": p["rdzv"] == "c10d",
            # Without restarts and wrapper, a worker's error is the node's: see _workers.
            "watch_workers": p["max_restarts"] == 0 and not p["wrapper"],
            "name": str(p["meta"].get("host") or socket.gethostname())}


def meet(m, paths, stop):
    """The start barrier, from the supervisor, then this node's place in the gang (_gang);
    (gang, None) or (None, why the start was called off). The run-state record keeps what it
    saw."""
    gang_sock = None
    if m["listen"]:
        gang_sock, error = bind(0)
        if gang_sock is None:
            return None, f"the gang's port: {error}"
    result = barrier(m["master_addr"], m["master_port"], m["run_id"], m["timeout"],
                     m["window"], listen=m["listen"], expect=m["expect"], source=m["source"],
                     gang=gang_sock, name=m["name"])
    record(paths, "barrier", where="supervisors", **barrier_seen(result))
    if not result["go"]:
        if gang_sock is not None:
            gang_sock.close()
        why = result.get("error") or result.get("back_error") or (
            f"{result.get('served')} of {m['expect']} nodes reached the master, and "
            f"{len(result.get('back_failed') or {})} could not be reached back"
            f"{': ' + str(result['back_failed']) if result.get('back_failed') else ''}")
        return None, why
    return join(m, gang_sock, result["gang_port"], stop, paths), None


def barrier_seen(result):
    """What the run-state record keeps of a barrier's result (not the gang's port)."""
    return {k: v for k, v in result.items() if k != "gang_port"}


def gang_formed(paths, joined, expected, error=None, lost=None, lost_at=None):
    """On the master: how many of the other nodes joined its gang, and, once its job ended
    everywhere, the nodes it lost (the record's gang section). The wait that watches the master
    alone for every node (torchrun_job's gang option) needs all of them joined, and names the
    lost ones."""
    said = {"joined": joined, "expected": expected}
    if error:
        said["error"] = error
    if lost is not None:
        said["lost"] = lost
    if lost_at:
        said["lost_at"] = lost_at  # when the master saw each lost node's link close
    record(paths, "gang", **said)


def join(m, sock, port, stop, paths):
    """This node's place in the gang once the barrier said go: the master answers on `sock`,
    every other node connects to `port` (None: the master has no gang, nor has this node).
    Every node of the gang follows its node log and says its last line of the job; the master
    keeps every node's in its record (the gang section's lines), for a live view."""
    if m["listen"]:
        # Every other node connects within the barrier's own time, and then some.
        gang = Master(sock, m["expect"] - 1, m["window"] + 2 * m["timeout"] + 5, stop,
                      m["elastic"], lambda joined, expected: gang_formed(paths, joined, expected),
                      lines=lambda nodes: record(paths, "gang", lines=nodes))
        gang.follow(paths["log"], m["name"], use=lambda: use_now(paths))
        return gang
    if not port:
        return None
    gang = Member(m["master_addr"], port, m["source"], m["timeout"], stop, m["name"],
                  m["elastic"])
    if gang.error:
        say(f"{gang.error}; this node goes on without the gang (the controller's watch "
            f"still stops it after a failure elsewhere)")
    gang.follow(paths["log"], use=lambda: use_now(paths))
    return gang


def use_now(paths):
    """The node's last sample of its use (the record's use section) as its gang word says it
    ("UTIL CELL": _gang's USE), "" before the first."""
    recent = (read_record(paths).get("use") or {}).get("recent") or []
    if not recent:
        return ""
    util = mean_util(recent[-1])
    return f"{'-' if util is None else round(util)} {point_cell(recent[-1])}"
