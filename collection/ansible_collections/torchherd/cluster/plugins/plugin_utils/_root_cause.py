# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Why one node's job failed: the failing rank, its exception and traceback, from torchrun's
report, the ranks' error files and stderr, and the node log; and what kind of failure that is."""

from __future__ import annotations

import glob
import json
import os
import re
import signal

from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import RECORD
from ansible_collections.torchherd.cluster.plugins.plugin_utils._run_files import (
    read_json,
    read_tail,
)

_ROOT_CAUSE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank\s*:\s*(\d+)\)")
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
# What a rank raises when a peer died first: a consequence, not the root cause.
SECONDARY = re.compile(r"Connection closed by peer|Connection reset|Connection refused|"
                       r"Broken pipe|SignalException|NCCL communicator was aborted|"
                       r"ncclRemoteError|remote worker|gloo/transport|Gloo connectFullMesh|"
                       r"Timed out|timed out|timeout|ProcessGroupGloo|DistBackendError|"
                       r"DistNetworkError")
# torch prefixes every line a rank writes to stderr with "[rankN]:"; torchrun's --tee, "[defaultN]:".
_PREFIX = re.compile(r"^(?:\[(?:rank|default)\d+\]: ?)+", re.MULTILINE)


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


def last_attempt(node_dir):
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


def rank_failure(rank_dir):
    """What one rank of the last attempt died of, and when: its error file (written by
    torchelastic's @record as the exception left main), else its stderr's last traceback,
    else the crash it reported on its way out (see _crash)."""
    error = os.path.join(rank_dir, "error.json")
    parsed = _error_file(error) if os.path.exists(error) else None
    if parsed and parsed[0]:
        return {"exception": parsed[0], "traceback": parsed[1], "at": _mtime(error)}
    stderr = os.path.join(rank_dir, "stderr.log")
    text = read_tail(stderr)
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
        candidates.append(((bool(SECONDARY.search(exception or "")), exception is None, at),
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
    node_log = read_tail(os.path.join(node_dir, "node.log"))
    called_off = _called_off(node_dir, node_log)
    if called_off:
        return dict(found, exception=called_off)
    ranks = last_attempt(node_dir)
    report = node_log[node_log.rfind("Failures:"):] if "Failures:" in node_log else ""
    entries = {int(local): (int(rank), int(code)) for rank, local, code in _ENTRY.findall(report)}
    marker = node_log.rfind("Root Cause")
    root = _ROOT_CAUSE.search(node_log, marker) if marker >= 0 else None
    if root:
        found["failing_rank"], found["local_rank"] = int(root.group(1)), int(root.group(2))
    candidates = []
    for local, (rank, code) in entries.items():
        failure = rank_failure(ranks[local]) if local in ranks else {
            "exception": None, "traceback": None, "at": float("inf")}
        # SIGTERM is what torchrun (and stop) send the other ranks; SIGKILL from the kernel's
        # OOM killer, or a crash (SIGSEGV, SIGABRT), is a failure of the rank's own.
        candidates.append(((code == -15, bool(SECONDARY.search(failure["exception"] or "")),
                            failure["exception"] is None, failure["at"], local),
                           rank, local, failure))
    if candidates:
        _key, found["failing_rank"], found["local_rank"], failure = min(candidates)
        # A rank that died of a signal (SIGABRT: a crash) says so, with what it said last.
        found["exception"] = _died_of(failure["exception"], entries[found["local_rank"]][1])
        found["traceback"] = failure["traceback"]
    elif found["local_rank"] is not None and found["local_rank"] in ranks:
        failure = rank_failure(ranks[found["local_rank"]])
        code = _EXITCODE.search(node_log, marker)
        found["exception"] = _died_of(failure["exception"], int(code.group(1)) if code else None)
        found["traceback"] = failure["traceback"]
    elif not ranks and (_RANK_LINE.search(node_log) or _LAUNCHER_EXIT.search(node_log)):
        # A launcher that writes no per-rank files (DeepSpeed's): torch prefixes what each rank
        # writes to stderr with [rankN]:, so the node log holds every rank's traceback.
        found.update(_failure_from_prefixes(node_log))
        ended = list(_LAUNCHER_EXIT.finditer(node_log))
        if ended and (found["exception"] is None or SECONDARY.search(found["exception"])):
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
                                 ((local, rank_failure(d)) for local, d in ranks.items()))
        if at != float("inf"):
            found["local_rank"] = local
            found["exception"], found["traceback"] = failure["exception"], failure["traceback"]
            prefix = _RANK_LINE.search(read_tail(os.path.join(ranks[local], "stderr.log")))
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


# The line the supervisor writes into the node log when the gang stops its job (supervise.py).
_GANG_STOP = "torchherd: stopping: "


def _called_off(node_dir, node_log):
    """Why a start in the background (its barrier in the supervisor) did not start here."""
    barrier = (read_json(os.path.join(node_dir, RECORD)) or {}).get("barrier")
    if not barrier or barrier.get("go"):
        return None
    line = next((ln for ln in reversed(node_log.splitlines())
                 if "the start was called off" in ln), "")
    return line.removeprefix("torchherd: ") or "the start was called off at the barrier"


def failed_before_stop(node_dir):
    """Whether a rank of a stopped node died of an error of its own (not a peer's lost
    connection, not the stop's signal) before the stop (the node's clock for both)."""
    stopped_at = ((read_json(os.path.join(node_dir, RECORD)) or {}).get("job") or {}).get("stopped_at")
    if not isinstance(stopped_at, (int, float)):
        return False
    for rank_dir in last_attempt(node_dir).values():
        failure = rank_failure(rank_dir)
        if (failure["exception"] and not SECONDARY.search(failure["exception"])
                and failure["at"] <= stopped_at):
            return True
    # A launcher that keeps no error file per rank (DeepSpeed's): a rank's own traceback in the
    # node log before the line the gang's stop wrote there (the supervisor's "stopping: ...").
    node_log = read_tail(os.path.join(node_dir, "node.log"))
    before, marker, _after = node_log.partition(f"\n{_GANG_STOP}")
    if not marker:
        return False
    exception = _failure_from_prefixes(before + "\n").get("exception")
    return bool(exception) and not SECONDARY.search(exception)


_KILLED = re.compile(r"killed by SIG|Signal \d+ \(SIG\w+\) received|KeyboardInterrupt")


def failure_kind(entry):
    """What kind of failure a node's summary entry shows, as the job's restart_on names them:
    node_lost (the node did not answer), connection (gloo or NCCL lost a peer: the rank's
    error is a connection's), signal (its launcher or a rank was killed by a signal, and no
    rank of its raised), or exception (its own code failed). A rank's own exception counts
    also where the node's launcher then ended by a signal: the gang's stop, after a peer's
    failure that this exception caused, may reach the node before its launcher's own end."""
    if entry.get("state") in ("lost", "unreachable"):
        return "node_lost"
    text = " ".join(str(entry.get(key) or "") for key in ("exception", "error"))
    if SECONDARY.search(text):
        return "connection"
    if _KILLED.search(text):
        return "signal"
    if str(entry.get("exception") or "").strip():
        return "exception"
    code = entry.get("exit_code")
    if isinstance(code, int) and (code < 0 or code > 128):
        return "signal"
    return "exception"
