# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""summary.json and merged.log of a run, from the run directory the collect phase filled.

Used in-process on the controller by the run_summary action (no interpreter to start; the
run_summary module holds its docs only), so it lives with the controller's plugins, not in
module_utils, which would be shipped to nodes.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time

from ansible_collections.torchherd.cluster.plugins.filter.redact import redact
from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    last_line,
    recorded_job,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    RECORD,
    ended_state,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._use import compact, idle_spells
from ansible_collections.torchherd.cluster.plugins.plugin_utils._root_cause import (
    SECONDARY,
    failed_before_stop,
    failure_kind,
    failure_of,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._run_files import (
    read_json,
    read_tail,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._timings import (
    phase_ends,
    phase_timings,
)

_BAD = ("failed", "lost", "timed_out")

_ENDED = ("succeeded", "failed", "stopped", "timed_out", "standby")


def newer(old, new):
    """Of two reports on one host, the one read later on that node's clock: a status that
    looked before a stop must not overwrite the stop's result when it finishes after it. A node
    that did not answer now has no clock to compare: its report wins over one that saw the
    job running (the node was lost since), not over one that saw the job's end there."""
    if not old or not old.get("checked_at"):
        return new
    if new.get("unreachable") and not new.get("checked_at"):
        return old if old.get("state") in _ENDED else new
    if (new.get("checked_at") or 0) < old["checked_at"]:
        return old
    return new


def _host_entry(run_dir, plan, node, res, previous):
    """One node's entry of the summary, from its result (node_results) and its collected run
    directory; ``previous``: the entry an earlier summary wrote for it."""
    host = node["host"]
    node_dir = os.path.join(run_dir, "nodes", host)
    state = res.get("job_state") or ("unreachable" if res.get("unreachable") else "unknown")
    if res.get("unreachable") and state in ("running", "unknown"):
        state = "lost"
    entry = {
        "node_rank": node["node_rank"], "address": node["address"], "state": state,
        # Started to wait in torchrun's rendezvous for a lost node (the plan's standbys).
        "standby": bool(node.get("standby")),
        # What preflight resolved for the node: its processes and its job's interface.
        "nproc_per_node": (plan.get("nprocs") or {}).get(host, node.get("nproc_per_node")),
        "interface": (plan.get("interfaces") or {}).get(host),
        "exit_code": res.get("exit_code"), "unreachable": bool(res.get("unreachable")),
        "error": res.get("error"), "last_line": res.get("last_line") or "",
        "started_at": res.get("started_at"), "ended_at": res.get("ended_at"),
        "first_output_at": res.get("first_output_at"),
        "standby_used": res.get("standby_used"),
        # Whether the launcher preflight started ahead ran the job here (start.warm).
        "warm": res.get("warm"),
        # Where torchrun restarts the workers itself: when each attempt started here, and
        # when its ranks first said something.
        "attempts": res.get("attempts") or {},
        "lost_at": res.get("lost_at"),
        "checked_at": res.get("checked_at"), "clock_offset": res.get("clock_offset"),
        "log": os.path.join(node_dir, "node.log") if os.path.exists(
            os.path.join(node_dir, "node.log")) else None,
        "logs_fetched": bool(res.get("logs_fetched")),
        "failing_rank": None, "exception": None, "traceback": None,
        # What the launch's sync sent to the node (status and collect keep the launch's).
        "sync": res.get("sync") or (previous or {}).get("sync"),
        # Its GPUs, CPU and memory while the job ran (the schedule's start.sample_every).
        "use": res.get("use") or (previous or {}).get("use"),
    }
    if state == "running":
        # The node's run directory, fetched after this result, may know better: a job
        # stopped (the gang stop after a hang) or ended since, or a node the watch did not
        # wait on (the master's gang spoke for it).
        job = recorded_job(node_dir)
        ended = ended_state(job)
        if ended:
            # On the controller's clock, as the results' times are (node_results).
            ended_at, offset = job.get("ended_at"), entry["clock_offset"]
            if ended_at is not None and offset is not None:
                ended_at = round(float(ended_at) - float(offset), 3)
            entry.update(state=ended, exit_code=int(job["exit_code"]), ended_at=ended_at,
                         started_at=entry["started_at"] or job.get("started_at"),
                         last_line=last_line(os.path.join(node_dir, "node.log")))
            state = ended
    if state == "stopped" and failed_before_stop(node_dir):
        # Its own rank raised before the gang's stop reached it (another node's peers,
        # failing on the lost connections, were heard first): a failure, not a stop.
        state = entry["state"] = "failed"
    if state in _BAD:
        entry.update(failure_of(node_dir))
    return entry


def _idle_gpus(run_dir, hosts):
    """{host: its longest spell of idle GPUs while another node's worked, in seconds}, from
    every sample its record kept (collect brought it back) or else the recent ones."""
    series = {}
    for host, h in hosts.items():
        kept = read_json(os.path.join(run_dir, "nodes", host, RECORD)) or {}
        series[host] = (kept.get("use") or {}).get("points") or (h.get("use") or {}).get("recent") or []
    return idle_spells(series)


def _waited(hosts):
    """The nodes that waited as standbys and were not needed (their end, whichever node it
    was): neither a failure nor a part of the job's result."""
    return [name for name, h in hosts.items() if h["state"] == "standby"]


def _verdict(plan, hosts, hang):
    """(the job's state, the reason, the node a failure is laid to (the root cause the reason
    names) or None); ``hang``: the hang the watch declared, or None (its C(stopped) set here)."""
    waited = _waited(hosts)
    states = [h["state"] for name, h in hosts.items() if name not in waited]
    bad = [(name, h) for name, h in hosts.items() if h["state"] in _BAD + ("unreachable",)]
    lost = [name for name, h in bad if h["state"] in ("lost", "unreachable")]
    done = [name for name, h in hosts.items() if h["state"] == "succeeded"]
    working = len(hosts) - len(waited)
    job = plan.get("job") or {}
    minimum = int(str(plan.get("nnodes") or len(hosts)).split(":", 1)[0])
    if hang and overall_hung(hosts, hang["declared_at"]):
        hang["stopped"] = not any(h["state"] == "running" for h in hosts.values())
        return "hung", (
            f"no progress from any rank for {hang['quiet_for'] or hang['timeout']:g} s "
            f"(hang_timeout {hang['timeout']:g} s): {hang['where'] or 'no stacks read'}"
            + ("; the job was stopped" if hang["stopped"] else
               "; the job is left running (stop it with the run id)")), None
    if (job.get("rdzv") == "c10d" and bad and len(lost) == len(bad)
            and len(done) == working - len(lost) and len(done) >= minimum):
        # Elastic: torchrun re-formed the group without the lost nodes and finished.
        reason = (f"succeeded on {len(done)} of {len(hosts)} nodes after losing "
                  f"{', '.join(lost)} (elastic, minimum {minimum})")
        took = [n for n in done if hosts[n]["standby"]]
        if took:
            reason += f"; {', '.join(took)} took the place as standby"
        return "succeeded", reason, None
    if bad:
        cause = _root_cause(bad, lost)
        return "failed", _failure_reason(cause, hosts[cause]), cause
    if waited and not states:
        return "failed", ("no node started the job's workers: torchrun's rendezvous never "
                          "formed (see the nodes' logs)"), None
    if states and all(s == "succeeded" for s in states):
        return "succeeded", "every node exited 0" + (
            f" ({', '.join(waited)} waited as standby, not needed)" if waited else ""), None
    if any(s == "running" for s in states):
        return "running", "the job is running", None
    if states and all(s in ("stopped", "succeeded") for s in states):
        return "stopped", "the job was stopped", None
    return "unknown", f"node states: {', '.join(sorted(set(states)))}", None


def _root_cause(bad, lost):
    """The node a failure is laid to: a lost node (its peers fail because of it); otherwise
    the node that failed first; the rest were stopped after it."""
    name, _h = min(bad, key=lambda item: (item[0] not in lost,
                                          bool(SECONDARY.search(item[1]["exception"] or "")),
                                          item[1]["ended_at"] or float("inf")))
    return name


def _failure_reason(name, h):
    if h["state"] in ("lost", "unreachable"):
        return (f"node {name} (node_rank {h['node_rank']}) was lost: "
                f"{h['error'] or 'unreachable'}; once it answers again, stop and collect "
                f"of this run id end what is left of the job there and fetch its logs")
    if h["state"] == "timed_out":
        return f"node {name} (node_rank {h['node_rank']}) hit the job timeout"
    rank = f" rank {h['failing_rank']}" if h["failing_rank"] is not None else ""
    return (f"node {name} (node_rank {h['node_rank']}){rank}: "
            f"{h['exception'] or 'exit code ' + str(h['exit_code'])}")


def _timings(plan, marks, results, hosts):
    """The phases' timings (phase_timings) of the run the summary is of."""
    waited = _waited(hosts)
    states = [h["state"] for name, h in hosts.items() if name not in waited]
    return phase_timings(
        plan.get("started_at"), phase_ends(marks, {n["host"]: results.get(n["host"], {})
                                                   for n in plan["nodes"]}),
        plan.get("launched_at"),
        min((h["first_output_at"] for h in hosts.values()
             if h.get("first_output_at") is not None), default=None),
        # Where the job has ended on every node it ran on (not for a detached launch).
        # A standby the job did not need ends after it: not counted.
        max((h["ended_at"] for name, h in hosts.items()
             if h.get("ended_at") is not None and name not in waited),
            default=None) if states and all(s in _ENDED for s in states) else None,
        [h.get("warm") for h in hosts.values()])


def summarize(run_dir, plan, results, marks, previous=None, not_asked=()):
    previous = previous or {}
    hosts = {}
    for node in plan["nodes"]:
        host = node["host"]
        if host in not_asked and previous.get(host):
            # Outside ansible-playbook's limit: no task asked it, the last word on it stands.
            hosts[host] = previous[host]
            continue
        entry = _host_entry(run_dir, plan, node, results.get(host, {}), previous.get(host))
        hosts[host] = newer(previous.get(host), entry)
    hang = hang_of(run_dir)
    idle = _idle_gpus(run_dir, hosts)
    overall, reason, cause = _verdict(plan, hosts, hang)
    job = plan.get("job") or {}
    return {
        "run_id": plan.get("run_id"), "state": overall, "reason": reason, "cause": cause,
        "cause_kind": failure_kind(hosts[cause]) if cause else None,
        # The whole-job restart this summary is of (0: the first launch; the driver's restarts).
        "restart": plan.get("restart") or 0,
        "run_dir": os.path.abspath(run_dir), "written_at": time.time(),
        "world_size": plan.get("world_size"), "nnodes": plan.get("nnodes"),
        "nproc_per_node": plan.get("nproc_per_node"), "master": plan.get("master"),
        "timings": _timings(plan, marks, results, hosts),
        "hosts": hosts,
        "sync": _sync_total(hosts), "hang": hang,
        # The nodes whose GPUs sat idle while the others' worked, and their longest such spell
        # in seconds: a straggler or a stuck rank.
        "idle_gpus": idle,
        # The interconnect check of this run (or the measure it reused), without every node's
        # raw result (preflight.json has those).
        "interconnect": {k: v for k, v in (plan.get("interconnect") or {}).items()
                         if k != "results"} or None,
        # What preflight warned of and let start (persistence mode off, a small /dev/shm, ...).
        "preflight_warnings": plan.get("preflight_warnings") or [],
        # The nodes preflight left out where the inventory held spares, and why.
        "left_out": {**(plan.get("excluded") or {}), **(plan.get("left_out") or {})},
        **({"incidents": standby_incidents(hosts)} if job.get("detach") and int(
            job.get("restarts") or 0) else {}),
    }


def standby_incidents(hosts):
    """The incidents of a job whose restarts are torchrun's (a detached job that allows
    restarts), as its nodes' ends show them: each lost node, in the order the master's gang
    lost them, with the standby that took its place (one that started workers: its record
    says so once it ended, its attempts while it runs), and the time from the loss to the
    first output of an attempt begun after it on any node; the driver's incidents' keys."""
    lost = sorted((h.get("lost_at") or h.get("ended_at") or float("inf"), name)
                  for name, h in hosts.items() if h["state"] in ("lost", "unreachable"))
    took = sorted(name for name, h in hosts.items() if h["standby"] and (
        h.get("standby_used") or (h.get("standby_used") is None and h["attempts"])))
    incidents = []
    for number, (at, name) in enumerate(lost, start=1):
        at = None if at == float("inf") else at
        # The first output of an attempt that started after the loss, on any node (the ranks
        # of an attempt running at the loss say their errors then).
        after = min((a["output_at"] for h in hosts.values() for a in h["attempts"].values()
                     if at is not None and a.get("output_at") is not None
                     and (a.get("started_at") or 0) > at), default=None)
        incidents.append({
            "restart": number, "by": "torchrun", "at": at, "kind": "node_lost", "node": name,
            "node_rank": hosts[name]["node_rank"], "why": hosts[name].get("error") or "lost",
            "replaced_by": took[number - 1] if number <= len(took) else None,
            "first_output_after": round(after - at, 3) if after is not None else None})
    return incidents


def overall_hung(hosts, declared_at):
    """A job declared hung stays hung whatever its nodes say after (stopped, left running, or
    failed as the stop of their peers closed their connections), unless it succeeded on every
    node or a node had failed before the hang was declared (then that failure is the cause)."""
    if all(h["state"] == "succeeded" for h in hosts.values()):
        return False
    return not any(h["state"] in _BAD and h.get("ended_at") is not None
                   and declared_at is not None and h["ended_at"] < declared_at
                   for h in hosts.values())


def hang_of(run_dir):
    """The hang the watch declared (watch/hung.json) with where the ranks were (the newest
    report in stacks/), or None."""
    declared = read_json(os.path.join(run_dir, "watch", "hung.json"))
    if not declared:
        return None
    stacks_dir = os.path.join(run_dir, "stacks")
    reports = sorted(f for f in (os.listdir(stacks_dir) if os.path.isdir(stacks_dir) else [])
                     if f.endswith(".json"))
    report = read_json(os.path.join(stacks_dir, reports[-1])) if reports else None
    return {"declared_at": declared.get("declared_at"),
            "declared_by": declared.get("declared_by"),
            "timeout": declared.get("timeout"), "quiet_for": declared.get("quiet_for"),
            "stopped": None,
            "where": (report or {}).get("summary"),
            "odd": (report or {}).get("odd") or [],
            "stacks": os.path.join(stacks_dir, reports[-1][:-5] + ".txt") if reports else None}


def _sync_total(hosts):
    sent = [h["sync"] for h in hosts.values() if h.get("sync")]
    if not sent:
        return None
    return {"files": sum(s["files"] for s in sent), "bytes": sum(s["bytes"] for s in sent),
            "nodes_sent_to": sum(1 for s in sent if s["files"] or s["bytes"])}


_LOCAL = re.compile(r"^\[default(\d+)\]:")


def merge_logs(run_dir, plan, out_path):
    """Every node's log in one file, each line prefixed with its host and global rank."""
    nproc = plan.get("nproc_per_node")
    static = (plan.get("job") or {}).get("rdzv", "static") == "static" and isinstance(nproc, int)
    lines = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for node in plan["nodes"]:
            text = read_tail(os.path.join(run_dir, "nodes", node["host"], "node.log"), 64 << 20)
            for line in text.splitlines():
                match = _LOCAL.match(line)
                if match:
                    local = int(match.group(1))
                    who = (f"r{node['node_rank'] * nproc + local}" if static else f"l{local}")
                    line = line[match.end():]
                else:
                    who = "agent"
                out.write(f"{node['host']} {who}: {line}\n")
                lines += 1
    return lines


def table(summary):
    rows = [["node", "rank", "state", "exit", "logs", "use", "last line / error"]]
    for name, h in summary["hosts"].items():
        note = h["exception"] or h["error"] or h["last_line"]
        rows.append([name, str(h["node_rank"]) + (" (standby)" if h.get("standby") else ""),
                     h["state"],
                     "-" if h["exit_code"] is None else str(h["exit_code"]),
                     "yes" if h["logs_fetched"] else "no",
                     compact((h.get("use") or {}).get("stats") or {}) or "-", (note or "")[:100]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines += [f"left out {host}: {why}" for host, why in (summary.get("left_out") or {}).items()]
    lines += [f"idle GPUs on {host}: {seconds:g} s while the other nodes' GPUs worked (a straggler "
              f"or a stuck rank there?)" for host, seconds in (summary.get("idle_gpus") or {}).items()]
    lines.append(f"run {summary['run_id']}: {summary['state']} ({summary['reason']})")
    return "\n".join(lines)


def resolved_plan(run_dir, plan):
    """The plan as the summary shows it: its secret values hidden, and what preflight resolved
    on the nodes (its verdict in preflight.json: nproc_per_node auto, a master port of auto,
    the interfaces, the interconnect's measure, its warnings) in place of what the job asked.
    A run stopped before its verdict keeps the plan's own values."""
    gate = (read_json(os.path.join(run_dir, "preflight.json")) or {}).get("gate") or {}
    master = plan.get("master")
    if "master_port" in gate:
        master = {**(master or {}), "port": gate["master_port"]}
    return {**redact(plan),
            "nproc_per_node": gate.get("nproc_per_node", plan.get("nproc_per_node")),
            "world_size": gate.get("world_size", plan.get("world_size")),
            "nprocs": gate.get("nprocs", {}),
            "master": master,
            "interfaces": gate.get("interfaces", {}),
            "interconnect": gate.get("interconnect"),
            "preflight_warnings": gate.get("warnings", [])}


def write_summary(run_dir, plan, results, marks, not_asked=()):
    """Write summary.json and merged.log under run_dir; returns (summary, table, path).
    ``not_asked``: the nodes a limit kept out of reach, whose earlier entries stand."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "summary.json")
    # status, stop, collect and a following `logs` may write at once: merge under a lock.
    with open(os.path.join(run_dir, ".summary.lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, encoding="utf-8") as handle:
                earlier = json.load(handle)
        except (OSError, ValueError):
            earlier = {}
        summary = summarize(run_dir, plan, results, marks, earlier.get("hosts") or {},
                            not_asked)
        # The driver's whole-job restarts, which it adds once its last launch wrote the summary:
        # the record of the run, kept by a later status, stop or collect (the nodes know
        # nothing of them). A job whose restarts are torchrun's has its own from the nodes.
        if "incidents" not in summary and earlier.get("incidents"):
            summary["incidents"] = earlier["incidents"]
        merged = os.path.join(run_dir, "merged.log")
        summary["merged_log"] = merged if merge_logs(run_dir, plan, merged) else None
        write_atomic(path, json.dumps(summary, indent=2, sort_keys=True))
    return summary, table(summary), path
