# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""summary.json and merged.log of a run, from the run directory the collect phase filled.

Used in-process on the controller by the run_summary action (no interpreter to start; the
run_summary module holds its docs only), so it lives with the controller's plugins, not in
module_utils, which would be shipped to nodes.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import re
import signal
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import last_line
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import RECORD

_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank\s*:\s*(\d+)\)")
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_BAD = ("failed", "lost", "timed_out")
# What a rank raises when a peer died first: a consequence, not the root cause.
_SECONDARY = re.compile(r"Connection closed by peer|Connection reset|Connection refused|"
                        r"Broken pipe|SignalException|NCCL communicator was aborted|"
                        r"ncclRemoteError|remote worker|gloo/transport|Gloo connectFullMesh|"
                        r"Timed out|timed out|timeout|ProcessGroupGloo|DistBackendError|"
                        r"DistNetworkError")
# torch prefixes every line a rank writes to stderr with "[rankN]:"; torchrun's --tee, "[defaultN]:".
_PREFIX = re.compile(r"^(?:\[(?:rank|default)\d+\]: ?)+", re.MULTILINE)


def _read(path, limit=1 << 20):
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _traceback(text):
    """The last traceback in a log and its final exception line."""
    text = _PREFIX.sub("", text)
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None, None
    block = text[start:].strip().splitlines()
    exception = None
    for line in block[1:]:
        if line and not line.startswith((" ", "\t")):
            exception = line.strip()
            break
    return "\n".join(block[:200]), exception


# One entry of torchrun's failure report in node.log ("rank : 3 (local_rank: 1)", "exitcode : 1").
_ENTRY = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank\s*:\s*(\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_ATTEMPT = re.compile(r"attempt_(\d+)$")


def _mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return float("inf")


def _last_attempt(node_dir):
    """{local_rank: that rank's directory} of torchrun's last attempt on the node."""
    attempts = {}
    for path in glob.glob(os.path.join(node_dir, "torchrun", "**", "attempt_*"), recursive=True):
        match = _ATTEMPT.search(path)
        if match and os.path.isdir(path):
            attempts.setdefault(int(match.group(1)), []).append(path)
    if not attempts:
        return {}
    ranks = {}
    for path in sorted(attempts[max(attempts)]):
        for entry in os.listdir(path):
            if entry.isdigit():
                ranks[int(entry)] = os.path.join(path, entry)
    return ranks


def _error_file(path):
    """(exception, traceback) from a torchelastic error file, or None."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    message = data.get("message", data)
    traceback = None
    if isinstance(message, dict):
        extra = message.get("extraInfo") or message.get("extrainfo") or {}
        traceback = extra.get("py_callstack")
        text = str(message.get("message") or "")
    else:
        text = str(message)
    return (text.strip().splitlines()[-1] if text.strip() else None), traceback


def _rank_failure(rank_dir):
    """What one rank of the last attempt died of, and when: its error file (written by
    torchelastic's @record as the exception left main), else its stderr's last traceback,
    else the crash it reported on its way out (see _crash)."""
    error = os.path.join(rank_dir, "error.json")
    parsed = _error_file(error) if os.path.exists(error) else None
    if parsed and parsed[0]:
        return {"exception": parsed[0], "traceback": parsed[1], "at": _mtime(error)}
    stderr = os.path.join(rank_dir, "stderr.log")
    text = _read(stderr)
    traceback, exception = _traceback(text)
    if exception is None:
        exception = _crash(text)
    return {"exception": exception, "traceback": traceback,
            "at": _mtime(stderr) if exception else float("inf")}


# How a process that dies without a Python traceback says why: C++'s std::terminate (an
# exception no thread caught, e.g. in gloo's or a store's background thread; then SIGABRT)
# and CPython's fatal errors (then SIGABRT too).
_TERMINATE = re.compile(r"terminate called (?:after throwing an instance of '([^'\n]+)'"
                        r"(?:\s*\n[^\n]*?what\(\):\s*([^\n]*))?|[^\n]*)")
# (Not faulthandler's report of the signal itself, "Fatal Python error: Aborted", which follows
# the line that says why.)
_FATAL = re.compile(r"Fatal Python error: (?!Aborted$|Segmentation fault$|Bus error$|"
                    r"Floating point exception$|Illegal instruction$)[^\n]*", re.MULTILINE)


def _crash(text):
    """The last crash a process reported on its stderr (text), as one line, or None."""
    text = _PREFIX.sub("", text)
    found = [*_TERMINATE.finditer(text), *_FATAL.finditer(text)]
    if not found:
        return None
    last = max(found, key=lambda m: m.start())
    if last.re is _TERMINATE and last.group(1):
        what = (last.group(2) or "").strip()
        return (f"{last.group(1)}: {what}" if what else last.group(1)) + \
            " (uncaught in a C++ thread: std::terminate)"
    return last.group(0).strip()


def _signal_name(code):
    """SIGABRT for exit code -6 (a process the signal ended); None for an exit code >= 0."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _died_of(exception, code):
    """A rank's failure as the summary says it: its exception or crash, and the signal that
    ended it (code: its exit code, negative for a signal); None where neither is known (an
    exit code > 0 without a traceback: the node log may hold one)."""
    name = _signal_name(code)
    if exception:
        return f"{exception}; killed by {name}" if name and name not in exception else exception
    return f"killed by {name} ({-code}) without a traceback" if name else None


_RANK_LINE = re.compile(r"^\[rank(\d+)\]: ?(.*)$", re.MULTILINE)


def _failure_from_prefixes(node_log):
    """Failing rank, exception and traceback from a node log whose ranks' lines carry torch's
    [rankN]: prefix: a rank's own error before a peer's connection error, then the first in
    the log."""
    lines = {}
    first = {}
    for match in _RANK_LINE.finditer(node_log):
        rank = int(match.group(1))
        lines.setdefault(rank, []).append(match.group(2))
        if "Traceback (most recent call last):" in match.group(2):
            first.setdefault(rank, match.start())
    candidates = []
    for rank, at in first.items():
        traceback, exception = _traceback("\n".join(lines[rank]))
        candidates.append(((bool(_SECONDARY.search(exception or "")), exception is None, at),
                           rank, exception, traceback))
    if not candidates:
        return {}
    _key, rank, exception, traceback = min(candidates)
    return {"failing_rank": rank, "exception": exception, "traceback": traceback}


def failure_of(node_dir):
    """Failing rank, exception and traceback of one node.

    torchrun's "Root Cause (first observed failure)" is not reliable with several ranks per
    node: ranks that die between two of its polls get one timestamp, and the lowest local rank
    wins the tie, often a peer that only lost its connection to the rank that raised. So every
    failed rank of torchrun's report is weighed here: a rank that failed by itself before one
    terminated (SIGTERM), a real exception before a peer's connection error, then the
    earliest (the time its error file or stderr was last written, to the node's clock)."""
    found = {"failing_rank": None, "local_rank": None, "exception": None, "traceback": None}
    node_log = _read(os.path.join(node_dir, "node.log"))
    called_off = _called_off(node_dir, node_log)
    if called_off:
        return dict(found, exception=called_off)
    ranks = _last_attempt(node_dir)
    report = node_log[node_log.rfind("Failures:"):] if "Failures:" in node_log else ""
    entries = {int(local): (int(rank), int(code)) for rank, local, code in _ENTRY.findall(report)}
    marker = node_log.rfind("Root Cause")
    root = _ROOT_CAUSE.search(node_log, marker) if marker >= 0 else None
    if root:
        found["failing_rank"], found["local_rank"] = int(root.group(1)), int(root.group(2))
    candidates = []
    for local, (rank, code) in entries.items():
        failure = _rank_failure(ranks[local]) if local in ranks else {
            "exception": None, "traceback": None, "at": float("inf")}
        # SIGTERM is what torchrun (and stop) send the other ranks; SIGKILL from the kernel's
        # OOM killer, or a crash (SIGSEGV, SIGABRT), is a failure of the rank's own.
        candidates.append(((code == -15, bool(_SECONDARY.search(failure["exception"] or "")),
                            failure["exception"] is None, failure["at"], local),
                           rank, local, failure))
    if candidates:
        _key, found["failing_rank"], found["local_rank"], failure = min(candidates)
        # A rank that died of a signal (SIGABRT: a crash) says so, with what it said last.
        found["exception"] = _died_of(failure["exception"], entries[found["local_rank"]][1])
        found["traceback"] = failure["traceback"]
    elif found["local_rank"] is not None and found["local_rank"] in ranks:
        failure = _rank_failure(ranks[found["local_rank"]])
        code = _EXITCODE.search(node_log, marker)
        found["exception"] = _died_of(failure["exception"], int(code.group(1)) if code else None)
        found["traceback"] = failure["traceback"]
    elif not ranks and (_RANK_LINE.search(node_log) or _LAUNCHER_EXIT.search(node_log)):
        # A launcher that writes no per-rank files (DeepSpeed's): torch prefixes what each rank
        # writes to stderr with [rankN]:, so the node log holds every rank's traceback.
        found.update(_failure_from_prefixes(node_log))
        ended = list(_LAUNCHER_EXIT.finditer(node_log))
        if ended and (found["exception"] is None or _SECONDARY.search(found["exception"])):
            # No traceback of its own, but the launcher names the rank whose exit ended it:
            # one that died without a traceback (a crash, a signal) came first.
            local, code = int(ended[-1].group(1)), int(ended[-1].group(2))
            crash = _crash(node_log)
            if code < 0 or crash:
                found.update(failing_rank=None, local_rank=local, traceback=None,
                             exception=_died_of(crash, code))
    elif ranks:
        # No report from torchrun (killed, or never got that far; the supervisor ends it 2 s
        # after a rank failed): the error files alone, the rank from torch's [rankN]: prefix.
        at, local, failure = min((f["at"], local, f) for local, f in
                                 ((local, _rank_failure(d)) for local, d in ranks.items()))
        if at != float("inf"):
            found["local_rank"] = local
            found["exception"], found["traceback"] = failure["exception"], failure["traceback"]
            prefix = _RANK_LINE.search(_read(os.path.join(ranks[local], "stderr.log")))
            if prefix:
                found["failing_rank"] = int(prefix.group(1))
    if found["exception"] is None:
        found["traceback"], found["exception"] = _traceback(node_log)
        said = _REPORTED.search(node_log, max(marker, 0))
        if (found["exception"] and "ChildFailedError" in found["exception"] and said
                and said.group(1).startswith("Signal ")):
            # The launcher's own exception only reports a rank's failure: what it reports
            # (a signal, when the rank left no traceback) is the cause.
            found["exception"] = said.group(1).strip()
    return found


# DeepSpeed's launcher, when a rank's exit ended it: "[...'--local_rank=1'] exits with return
# code = -6" (its own exit code is that code modulo 256: 250).
_LAUNCHER_EXIT = re.compile(r"'--local_rank=(\d+)'\] exits with return code = (-?\d+)")
# torchrun's report of a rank's failure: what it knows of the cause ("Signal 6 (SIGABRT)
# received by PID 405" where the rank wrote no error file).
_REPORTED = re.compile(r"^\s*traceback\s*:\s*(\S[^\n]*)$", re.MULTILINE)


def _called_off(node_dir, node_log):
    """Why a start in the background (its barrier in the supervisor) did not start here."""
    barrier = (_json(os.path.join(node_dir, RECORD)) or {}).get("barrier")
    if not barrier or barrier.get("go"):
        return None
    line = next((ln for ln in reversed(node_log.splitlines())
                 if "the start was called off" in ln), "")
    return line.removeprefix("torchherd: ") or "the start was called off at the barrier"


PHASES = ("plan", "preflight", "sync", "start", "watch", "collect")


def phase_timings(started_at, marks, launched_at=None, first_output_at=None, ended_at=None,
                  warm=()):
    """Seconds spent in each phase, from the times the phases ended; `launch` (the driver's
    start and ansible-playbook's, up to the plan) where the driver said when it started,
    `first_output`: from the launch (or the plan) to the first output of any rank, and
    `after_end`: from the job's end on its last node to now (the summary). Where launchers
    started ahead ran the job (`warm`: the hosts' records of them), `launcher_started` and
    `launcher_ready`: from the launch to the last of them started, and to the last of them
    done with its imports."""
    timings, last = {}, started_at
    if launched_at is not None and started_at is not None:
        timings["launch"] = round(float(started_at) - float(launched_at), 3)
    for phase in PHASES:
        if phase in marks and last is not None:
            timings[phase] = round(float(marks[phase]) - float(last), 3)
            last = marks[phase]
    origin = launched_at if launched_at is not None else started_at
    if origin is not None:
        timings["total"] = round(time.time() - float(origin), 3)
        if first_output_at is not None:
            timings["first_output"] = round(float(first_output_at) - float(origin), 3)
        used = [w for w in warm if isinstance(w, dict) and w.get("used")
                and w.get("started_at") is not None and w.get("ready_at") is not None]
        for key, at in (("launcher_started", "started_at"), ("launcher_ready", "ready_at")):
            if used:
                timings[key] = round(max(float(w[at]) for w in used) - float(origin), 3)
    if ended_at is not None:
        timings["after_end"] = round(time.time() - float(ended_at), 3)
    return timings


def phase_ends(marks, results):
    """The phases' ends: ``marks`` (the plays' own), with the sync's and the start's taken from
    the node records (node_results) where the plays left them out. The sync ended when the last
    node's copy came back (at preflight's end where no node needed one), once every node's sync
    is recorded; the start when the last node's answer came back, once every node started."""
    ends, nodes = dict(marks), list(results.values())
    if nodes and "preflight" in ends and "sync" not in ends \
            and all(n.get("sync") is not None for n in nodes):
        copies = [float(n["sync_ended_at"]) for n in nodes if n.get("sync_ended_at") is not None]
        ends["sync"] = max([float(ends["preflight"])] + copies)
    if nodes and "sync" in ends and "start" not in ends \
            and all(n.get("start_answered_at") is not None for n in nodes):
        ends["start"] = max(float(n["start_answered_at"]) for n in nodes)
    return ends


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


_KILLED = re.compile(r"killed by SIG|Signal \d+ \(SIG\w+\) received")


def failure_kind(entry):
    """What kind of failure a node's summary entry shows, as the job's restart_on names them:
    node_lost (the node did not answer), connection (gloo or NCCL lost a peer: the rank's
    error is a connection's), signal (its launcher or a rank was killed by a signal), or
    exception (its own code failed)."""
    if entry.get("state") in ("lost", "unreachable"):
        return "node_lost"
    text = " ".join(str(entry.get(key) or "") for key in ("exception", "error"))
    if _SECONDARY.search(text):
        return "connection"
    code = entry.get("exit_code")
    if _KILLED.search(text) or (isinstance(code, int) and (code < 0 or code > 128)):
        return "signal"
    return "exception"


def summarize(run_dir, plan, results, marks, previous=None):
    previous = previous or {}
    hosts = {}
    for node in plan["nodes"]:
        host = node["host"]
        res = results.get(host, {})
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
            "sync": res.get("sync") or (previous.get(host) or {}).get("sync"),
        }
        if state == "running":
            # The node's run directory, fetched after this result, may know better: a job
            # stopped (the gang stop after a hang) or ended since, or a node the watch did not
            # wait on (the master's gang spoke for it).
            ended = _ended_state(node_dir)
            if ended:
                meta = _json(os.path.join(node_dir, "meta.json")) or {}
                # On the controller's clock, as the results' times are (node_results).
                ended_at, offset = meta.get("ended_at"), entry["clock_offset"]
                if ended_at is not None and offset is not None:
                    ended_at = round(float(ended_at) - float(offset), 3)
                entry.update(state=ended, exit_code=int(_read(os.path.join(
                    node_dir, "exit_code")).strip()), ended_at=ended_at,
                    started_at=entry["started_at"] or meta.get("started_at"),
                    last_line=last_line(os.path.join(node_dir, "node.log")))
                state = ended
        if state == "stopped" and _failed_before_stop(node_dir):
            # Its own rank raised before the gang's stop reached it (another node's peers,
            # failing on the lost connections, were heard first): a failure, not a stop.
            state = entry["state"] = "failed"
        if state in _BAD:
            entry.update(failure_of(node_dir))
        hosts[host] = newer(previous.get(host), entry)

    # A node that waited as a standby and was not needed (its end, whichever node it was):
    # neither a failure nor a part of the job's result.
    waited = [name for name, h in hosts.items() if h["state"] == "standby"]
    states = [h["state"] for name, h in hosts.items() if name not in waited]
    bad = [(name, h) for name, h in hosts.items() if h["state"] in _BAD + ("unreachable",)]
    lost = [name for name, h in bad if h["state"] in ("lost", "unreachable")]
    done = [name for name, h in hosts.items() if h["state"] == "succeeded"]
    working = len(hosts) - len(waited)
    job = plan.get("job") or {}
    minimum = int(str(plan.get("nnodes") or len(hosts)).split(":", 1)[0])
    cause = None  # the node a failure is laid to (the root cause the reason names)
    hang = hang_of(run_dir)
    if hang and overall_hung(hosts, hang["declared_at"]):
        hang["stopped"] = not any(h["state"] == "running" for h in hosts.values())
        overall = "hung"
        reason = (f"no progress from any rank for {hang['quiet_for'] or hang['timeout']:g} s "
                  f"(hang_timeout {hang['timeout']:g} s): {hang['where'] or 'no stacks read'}"
                  + ("; the job was stopped" if hang["stopped"] else
                     "; the job is left running (stop it with the run id)"))
    elif (job.get("rdzv") == "c10d" and bad and len(lost) == len(bad)
            and len(done) == working - len(lost) and len(done) >= minimum):
        # Elastic: torchrun re-formed the group without the lost nodes and finished.
        overall = "succeeded"
        reason = (f"succeeded on {len(done)} of {len(hosts)} nodes after losing "
                  f"{', '.join(lost)} (elastic, minimum {minimum})")
        took = [n for n in done if hosts[n]["standby"]]
        if took:
            reason += f"; {', '.join(took)} took the place as standby"
    elif bad:
        overall = "failed"
        # A lost node is the root cause (its peers fail because of it); otherwise the node
        # that failed first; the rest were stopped after it.
        name, h = min(bad, key=lambda item: (item[0] not in lost,
                                             bool(_SECONDARY.search(item[1]["exception"] or "")),
                                             item[1]["ended_at"] or float("inf")))
        cause = name
        if h["state"] in ("lost", "unreachable"):
            reason = (f"node {name} (node_rank {h['node_rank']}) was lost: "
                      f"{h['error'] or 'unreachable'}; once it answers again, stop and collect "
                      f"of this run id end what is left of the job there and fetch its logs")
        elif h["state"] == "timed_out":
            reason = f"node {name} (node_rank {h['node_rank']}) hit the job timeout"
        else:
            rank = f" rank {h['failing_rank']}" if h["failing_rank"] is not None else ""
            reason = (f"node {name} (node_rank {h['node_rank']}){rank}: "
                      f"{h['exception'] or 'exit code ' + str(h['exit_code'])}")
    elif waited and not states:
        overall = "failed"
        reason = ("no node started the job's workers: torchrun's rendezvous never formed "
                  "(see the nodes' logs)")
    elif states and all(s == "succeeded" for s in states):
        overall, reason = "succeeded", "every node exited 0" + (
            f" ({', '.join(waited)} waited as standby, not needed)" if waited else "")
    elif any(s == "running" for s in states):
        overall, reason = "running", "the job is running"
    elif states and all(s in ("stopped", "succeeded") for s in states):
        overall, reason = "stopped", "the job was stopped"
    else:
        overall, reason = "unknown", f"node states: {', '.join(sorted(set(states)))}"
    return {
        "run_id": plan.get("run_id"), "state": overall, "reason": reason, "cause": cause,
        "cause_kind": failure_kind(hosts[cause]) if cause else None,
        # The whole-job restart this summary is of (0: the first launch; the driver's restarts).
        "restart": plan.get("restart") or 0,
        "run_dir": os.path.abspath(run_dir), "written_at": time.time(),
        "world_size": plan.get("world_size"), "nnodes": plan.get("nnodes"),
        "nproc_per_node": plan.get("nproc_per_node"), "master": plan.get("master"),
        "timings": phase_timings(
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
            [h.get("warm") for h in hosts.values()]),
        "hosts": hosts,
        "sync": _sync_total(hosts), "hang": hang,
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


def _failed_before_stop(node_dir):
    """Whether a rank of a stopped node died of an error of its own (not a peer's lost
    connection, not the stop's signal) before the stop (the node's clock for both)."""
    try:
        stopped_at = float(_read(os.path.join(node_dir, "stopped")).strip())
    except ValueError:
        return False
    for rank_dir in _last_attempt(node_dir).values():
        failure = _rank_failure(rank_dir)
        if (failure["exception"] and not _SECONDARY.search(failure["exception"])
                and failure["at"] <= stopped_at):
            return True
    return False


def _ended_state(node_dir):
    """The job's end as the node's collected run directory records it, or None."""
    code = _read(os.path.join(node_dir, "exit_code")).strip()
    if not code.lstrip("-").isdigit():
        return None
    if os.path.exists(os.path.join(node_dir, "stopped")):
        return "stopped"
    if os.path.exists(os.path.join(node_dir, "timed_out")):
        return "timed_out"
    if os.path.exists(os.path.join(node_dir, "standby")):
        return "standby"
    return "succeeded" if int(code) == 0 else "failed"


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
    declared = _json(os.path.join(run_dir, "watch", "hung.json"))
    if not declared:
        return None
    stacks_dir = os.path.join(run_dir, "stacks")
    reports = sorted(f for f in (os.listdir(stacks_dir) if os.path.isdir(stacks_dir) else [])
                     if f.endswith(".json"))
    report = _json(os.path.join(stacks_dir, reports[-1])) if reports else None
    return {"declared_at": declared.get("declared_at"),
            "declared_by": declared.get("declared_by"),
            "timeout": declared.get("timeout"), "quiet_for": declared.get("quiet_for"),
            "stopped": None,
            "where": (report or {}).get("summary"),
            "odd": (report or {}).get("odd") or [],
            "stacks": os.path.join(stacks_dir, reports[-1][:-5] + ".txt") if reports else None}


def _json(path):
    text = _read(path)
    try:
        data = json.loads(text) if text else None
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


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
            text = _read(os.path.join(run_dir, "nodes", node["host"], "node.log"), 64 << 20)
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
    rows = [["node", "rank", "state", "exit", "logs", "last line / error"]]
    for name, h in summary["hosts"].items():
        note = h["exception"] or h["error"] or h["last_line"]
        rows.append([name, str(h["node_rank"]) + (" (standby)" if h.get("standby") else ""),
                     h["state"],
                     "-" if h["exit_code"] is None else str(h["exit_code"]),
                     "yes" if h["logs_fetched"] else "no", (note or "")[:100]])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]
    lines += [f"left out {host}: {why}" for host, why in (summary.get("left_out") or {}).items()]
    lines.append(f"run {summary['run_id']}: {summary['state']} ({summary['reason']})")
    return "\n".join(lines)


def write_summary(run_dir, plan, results, marks):
    """Write summary.json and merged.log under run_dir; returns (summary, table, path)."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, "summary.json")
    # status, stop, collect and a following `logs` may write at once: merge under a lock.
    with open(os.path.join(run_dir, ".summary.lock"), "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, encoding="utf-8") as handle:
                previous = json.load(handle).get("hosts") or {}
        except (OSError, ValueError):
            previous = {}
        summary = summarize(run_dir, plan, results, marks, previous)
        merged = os.path.join(run_dir, "merged.log")
        summary["merged_log"] = merged if merge_logs(run_dir, plan, merged) else None
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(summary, handle, indent=2, sort_keys=True)
        os.replace(tmp, path)
    return summary, table(summary), path
