# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Where every rank of a job is, read from outside: the Python stack of each of the job's
processes on this node (py-spy, which reads another process's memory without stopping it), and
on NCCL the Flight Recorder's record of the collectives, which each rank dumps when asked
through its pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE; the start sets it up for NCCL jobs), and
NCCL's own view of the job's communicators from its RAS service (NCCL 2.24 and later), which
answers on a local TCP port even while the ranks' own threads are stuck."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from ansible_collections.torchherd.cluster.plugins.module_utils._proc import read_stat
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import job_pids

# What the start exports for NCCL jobs (a user's own value wins): a record of the last
# collectives in every rank, dumped on a watchdog timeout and on demand through a pipe.
FLIGHT_RECORDER_BUFFER = "2000"
# The torch that sizes the record by TORCH_FR_BUFFER_SIZE and warns on every NCCL process
# group that TORCH_NCCL_TRACE_BUFFER_SIZE "is deprecated; use TORCH_FR_BUFFER_SIZE instead"
# (torch reads both names in one list and warns about the old one even beside the new).
FR_BUFFER_RENAMED = (2, 11)
BUFFER_NAMES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def _torch_release(version):
    """(major, minor) of a torch version string (2.13.0+cu130, 2.11.0a0+git...), or None."""
    match = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def flight_recorder_env(directory, torch_version=None, given=()):
    """The environment that makes every NCCL rank keep a Flight Recorder and dump it into
    `directory` (rank_<N>) when its pipe (pipe_<N>.pipe) is written to or its watchdog times out.

    The buffer's size goes under the name the job's torch (`torch_version`, from the node's
    facts) reads without a warning; the older name where the version is unknown, which every
    torch reads. Left out where the job's environment (`given`: its names) sizes it already
    under either name: torch prefers the new name, so ours would override the user's old one.
    Both names of the dump prefix are set: torch reads each alone (no warning), one for the
    fixed file names and one for the dynamic ones."""
    prefix = os.path.join(directory, "rank_")
    env = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix, "TORCH_FR_DUMP_TEMP_FILE": prefix,
           "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": os.path.join(directory, "pipe_")}
    if not set(BUFFER_NAMES) & set(given):
        release = _torch_release(torch_version)
        renamed = release is not None and release >= FR_BUFFER_RENAMED
        env[BUFFER_NAMES[0 if renamed else 1]] = FLIGHT_RECORDER_BUFFER
    return env


# NCCL's RAS: where its client socket listens unless NCCL_RAS_ADDR says otherwise, the protocol
# version of the client (NCCL answers with its own and goes on where they differ), and how long
# its collective across the job's processes may wait for each leg (NCCL's default is 5 s).
RAS_ADDRESS = "localhost:28028"
RAS_PROTOCOL = 2
RAS_TIMEOUT = 5
# The sections of RAS's status text that tell what is wrong ("Errors", "Warnings"), each title
# above a line of "=" (as long as the title, or not: "Communicators... (0.000s)").
RAS_SECTIONS = ("Errors", "Warnings")


# The fix where py-spy may not read a process's memory: the report says it once, not per rank.
PTRACE_FIX = ("py-spy needs to read the process's memory: run as the job's user, or as root "
              "where kernel.yama.ptrace_scope is 1 or more")


class StacksError(Exception):
    """Why no stack can be read on this node at all (its message), and the fix (`fix`): apart,
    so that a report over many nodes says one fix once."""

    def __init__(self, message, fix=None):
        super().__init__(message)
        self.fix = fix


def py_spy_path(python):
    """py-spy next to the job's interpreter (a venv's bin), else on PATH; None without one."""
    if python:
        beside = os.path.join(os.path.dirname(python), "py-spy")
        if os.access(beside, os.X_OK):
            return beside
    return shutil.which("py-spy")


def find_py_spy(python):
    """py_spy_path, or StacksError with the fix."""
    found = py_spy_path(python)
    if not found:
        install = f"{python} -m pip install py-spy" if python else "pip install py-spy"
        raise StacksError(
            f"py-spy: expected py-spy next to {python or 'the job interpreter'} or on PATH, "
            "found neither", f"{install} into the job's environment on every node (a static "
            "binary, no build)")
    return found


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            raw = handle.read().split(b"\0")
    except OSError:
        return None
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [a.decode(errors="replace") for a in handle.read().split(b"\0") if a]
    except OSError:
        return []


def processes(run_dir):
    """The job's processes here: pid, its rank and local rank from its environment, and its
    role - C(rank) (a rank's own process), C(child) (a process a rank started, e.g. a data
    loader worker, which inherits the rank's environment) or C(launcher) (torchrun, accelerate,
    DeepSpeed's launcher, without a rank)."""
    found = []
    pids = job_pids(run_dir)
    envs = {pid: _environ(pid) or {} for pid in pids}
    for pid in pids:
        env = envs[pid]
        rank = env.get("RANK")
        parent = (read_stat(pid) or {}).get("ppid")
        if rank is None:
            role = "launcher"
        elif parent in envs and envs[parent].get("RANK") == rank:
            role = "child"
        else:
            role = "rank"
        found.append({"pid": pid, "rank": int(rank) if rank and rank.isdigit() else None,
                      "local_rank": int(env["LOCAL_RANK"]) if env.get("LOCAL_RANK", "").isdigit()
                      else None, "role": role, "cmdline": _cmdline(pid)[:8],
                      "pipe": env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"),
                      "ras": ras_address(env),
                      "dump": env.get("TORCH_FR_DUMP_TEMP_FILE")
                      or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")})
    return found


def dump(py_spy, pid, timeout=15.0):
    """(threads, error, fix) of one process: py-spy's JSON (threads with frames, innermost
    first), or why not and, where known, the fix."""
    argv = [py_spy, "dump", "--pid", str(pid), "--json", "--nonblocking"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, f"py-spy took more than {timeout:g} s", None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        error = " ".join(lines[:2]) or f"py-spy exit code {proc.returncode}"
        return None, error[:500], PTRACE_FIX if "Permission" in error else None
    try:
        threads = json.loads(proc.stdout)
    except ValueError:
        return None, "py-spy printed no JSON", None
    return [{"thread_id": t.get("os_thread_id"), "name": t.get("thread_name"),
             "main": t.get("os_thread_id") == pid, "active": t.get("active"),
             "frames": [{"name": f.get("name"), "file": f.get("filename"),
                         "line": f.get("line")} for f in t.get("frames") or []]}
            for t in threads], None, None


def _is_fifo(path):
    try:
        return stat.S_ISFIFO(os.stat(path).st_mode)
    except OSError:
        return False


def ask_flight_recorder(procs, wait):
    """Writes to the Flight Recorder pipe of every rank that has one and waits up to `wait`
    seconds for its dump; the dumps found (they are in the run directory, which collect brings
    back), and the ranks that did not answer."""
    asked = {}
    for proc in procs:
        if proc["role"] != "rank" or not proc["pipe"] or proc["rank"] is None:
            continue
        pipe = f"{proc['pipe']}{proc['rank']}.pipe"
        if not _is_fifo(pipe):
            continue
        try:
            # Non-blocking: a rank whose watchdog no longer reads its pipe must not hang us.
            handle = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
            try:
                os.write(handle, b"1\n")
            finally:
                os.close(handle)
        except OSError:
            continue
        asked[proc["rank"]] = f"{proc['dump'] or ''}{proc['rank']}"
    deadline = time.monotonic() + wait
    while asked and time.monotonic() < deadline and \
            not all(os.path.exists(path) for path in asked.values()):
        time.sleep(0.2)
    return ({rank: path for rank, path in asked.items() if os.path.exists(path)},
            sorted(rank for rank, path in asked.items() if not os.path.exists(path)))


def ras_address(env):
    """Where NCCL's RAS of a process with this environment answers: None for a process that is
    no NCCL rank (the start sets up the Flight Recorder's pipe in every NCCL rank) or one whose
    RAS is off (NCCL_RAS_ENABLE=0)."""
    if not env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE") or env.get("RANK") is None \
            or env.get("NCCL_RAS_ENABLE", "1").strip() == "0":
        return None
    return env.get("NCCL_RAS_ADDR") or RAS_ADDRESS


def _split_address(address):
    host, _colon, port = address.rpartition(":")
    return host.strip("[]") or "localhost", int(port)


def ask_nccl_ras(address, timeout=RAS_TIMEOUT):
    """NCCL's RAS status of the job, as its client (ncclras) asks for it: {address, text,
    error}. The text is NCCL's own report of the job's communicators (which ranks have not
    joined, which are behind in their collectives, which are dead); error says why there is
    none (nothing listens there: an older NCCL, RAS off, no communicator made yet)."""
    found = {"address": address, "text": None, "error": None}
    try:
        host, port = _split_address(address)
        with socket.create_connection((host, port), timeout=2) as sock:
            # The legs of RAS's collective may take `timeout` each; the whole answer its double.
            sock.settimeout(2 * timeout + 5)
            reader = sock.makefile("r", encoding="utf-8", errors="replace", newline="\n")
            sock.sendall(f"CLIENT PROTOCOL {RAS_PROTOCOL}\n".encode())
            hello = reader.readline()
            if not hello.upper().startswith("SERVER PROTOCOL"):
                raise OSError(f"not NCCL's RAS: {hello.strip()[:80]!r}")
            sock.sendall(f"TIMEOUT {int(timeout)}\n".encode())
            answer = reader.readline()
            if answer.strip().upper() != "OK":
                raise OSError(f"RAS refused the timeout: {answer.strip()[:80]!r}")
            sock.sendall(b"STATUS\n")
            found["text"] = reader.read()
    except (OSError, ValueError) as exc:
        found["error"] = str(exc) or type(exc).__name__
    return found


def ras_findings(text):
    """{section: [its lines]} of RAS's status text for the sections that say what is wrong
    (RAS_SECTIONS), without the empty ones."""
    found, section, lines = {}, None, (text or "").splitlines()
    for i, line in enumerate(lines):
        title = line.strip()
        underline = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if title and set(title) != {"="} and len(underline) >= 3 and set(underline) == {"="}:
            section = title if title in RAS_SECTIONS else None
            continue
        if section and title and set(title) != {"="}:
            found.setdefault(section, []).append(line.rstrip())
    return found


def nccl_ras(procs):
    """ask_nccl_ras with its findings (ras_findings) for the job's processes `procs`, where one
    of them is an NCCL rank with RAS on; None otherwise."""
    address = next((proc["ras"] for proc in procs if proc.get("ras")), None)
    if not address:
        return None
    found = ask_nccl_ras(address)
    found["findings"] = ras_findings(found["text"])
    return found


def collect(run_dir, python, flight_recorder_wait=10.0):
    """Every process of the job here with its stack; raises StacksError without py-spy."""
    procs = processes(run_dir)
    if not procs:
        return {"processes": [], "flight_recorder": {}, "flight_recorder_missing": [],
                "nccl_ras": None}
    py_spy = find_py_spy(python)
    # Python processes only: a launcher may be a shell (srun, a wrapper) that py-spy cannot read.
    with ThreadPoolExecutor(max_workers=min(16, len(procs)) + 1) as pool:
        # NCCL's RAS answers meanwhile (its collective may wait for every leg's timeout).
        ras = pool.submit(nccl_ras, procs)
        dumps = list(pool.map(lambda proc: dump(py_spy, proc["pid"]), procs))
        for proc, (threads, error, fix) in zip(procs, dumps):
            proc.update(threads=threads, error=error, fix=fix)
        dumps, missing = ask_flight_recorder(procs, flight_recorder_wait)
        ras = ras.result()
    return {"processes": procs, "flight_recorder": dumps, "flight_recorder_missing": missing,
            "nccl_ras": ras}
