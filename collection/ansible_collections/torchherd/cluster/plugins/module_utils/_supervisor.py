# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Starting a job on one node: torchrun's command line and environment, and the detached
supervisor that runs it and writes the run directory (see _rundir) as the job goes.

Takes the torchrun_job module's parameters as they are (p)."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import (
    ProcessRunner,
    close_rules,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._gang import Master, Member
from ansible_collections.torchherd.cluster.plugins.module_utils._probe import barrier, bind
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    LAUNCHER_GRACE,
    MARKER,
    load_json,
    proc_start_time,
    read_state,
    read_text,
    terminate,
    write_atomic,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._stacks import flight_recorder_env
from ansible_collections.torchherd.cluster.plugins.module_utils._stop import stop


class StartError(Exception):
    """Why the job cannot start here; `result` holds the fields that tell what is there."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.result = result


def check_start(p, paths):
    """Raises StartError unless the job can start here."""
    current = read_state(paths)
    if current["state"] != "absent":
        raise StartError(
            f"run {p['run_id']} already exists on this node (state {current['state']}, "
            f"run dir {paths['dir']}); a run id starts once: stop it or choose another run id",
            job_state=current["state"], run_dir=paths["dir"])
    if not p["script"]:
        raise StartError("script is required with state=started")
    if p["wrapper"] and not shutil.which(p["wrapper"][0]):
        raise StartError(f"wrapper: expected {p['wrapper'][0]} on this node's PATH, found "
                         f"none; fix: install it, or give its absolute path")


def launcher_argv(p, paths):
    """The command line of this node's launcher: the wrapper (srun), the launcher with what the
    plan decided for this node, the user's launcher options, the script and its arguments."""
    python = p["python"] or sys.executable
    argv = _LAUNCHERS[p["launcher"]](p, paths, python)
    return list(p["wrapper"]) + argv + list(p["launcher_args"]) + [p["script"]] + list(p["args"])


def _torchrun(p, paths, python):
    argv = [python, "-m", "torch.distributed.run",
            "--nnodes", p["nnodes"], "--nproc-per-node", str(p["nproc_per_node"]),
            "--max-restarts", str(p["max_restarts"]),
            # Per-rank stdout/stderr files plus a copy on torchrun's output, prefixed by rank.
            "--log-dir", paths["torchrun_logs"], "--redirects", "3", "--tee", "3"]
    if p["rdzv"] == "c10d":
        argv += ["--rdzv-backend", "c10d",
                 "--rdzv-endpoint", f"{p['master_addr']}:{p['master_port']}",
                 "--rdzv-id", p["run_id"]]
        if p["rdzv_conf"]:
            argv += ["--rdzv-conf",
                     ",".join(f"{k}={v}" for k, v in sorted(p["rdzv_conf"].items()))]
    else:
        argv += ["--node-rank", str(p["node_rank"]),
                 "--master-addr", p["master_addr"], "--master-port", str(p["master_port"])]
    return argv


def _accelerate(p, paths, python):
    # accelerate's multi-process launcher calls torch.distributed.run in its own process (GPU
    # or, with ACCELERATE_USE_CPU=1 in job_env, CPU with gloo); --same_network gives it the
    # static rendezvous with this node's rank. --num_processes counts every node's processes.
    nnodes = int(p["nnodes"])
    return [python, "-m", "accelerate.commands.launch", "--multi_gpu", "--same_network",
            "--num_machines", str(nnodes), "--machine_rank", str(p["node_rank"]),
            "--num_processes", str(nnodes * p["nproc_per_node"]),
            "--main_process_ip", p["master_addr"], "--main_process_port", str(p["master_port"]),
            "--max_restarts", str(p["max_restarts"]),
            "--log_dir", paths["torchrun_logs"], "--tee", "3"]


def _deepspeed(p, paths, python):
    # The per-node launcher that DeepSpeed's own runner starts on each host over pdsh; the world
    # is described as it would: every node in node-rank order with its local ranks.
    counts = p["node_nprocs"] or [p["nproc_per_node"]] * int(p["nnodes"])
    world = {f"node{i}": list(range(count)) for i, count in enumerate(counts)}
    info = base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
    return [python, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={info}",
            f"--node_rank={p['node_rank']}", f"--master_addr={p['master_addr']}",
            f"--master_port={p['master_port']}"]


_LAUNCHERS = {"torchrun": _torchrun, "accelerate": _accelerate, "deepspeed": _deepspeed}


def job_env(p, run_dir, environ):
    """(environment of the job, the same as written to env.json with secret values redacted)."""
    env = dict(environ)
    # Ansible's own variables must not leak into the job.
    for key in [k for k in env if k.startswith("ANSIBLE_")]:
        del env[key]
    if p["rdzv"] == "c10d":
        # A fresh worker store per rendezvous round: see the module's rdzv option.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    # What the launcher needs besides its command line, shown in env.json with the job's own.
    launcher_env = {}
    if p["launcher"] == "accelerate" and p["use_cpu"]:
        # Without it accelerate's multi-process mode on a node without GPUs starts every
        # process as a world of one, silently.
        launcher_env["ACCELERATE_USE_CPU"] = "1"
    if str(p["env"].get("TORCHHERD_BACKEND")) == "nccl":
        # Every rank keeps a record of its last collectives and dumps it when asked (stacks)
        # or when its watchdog times out: where a hung job's ranks were in NCCL.
        launcher_env.update(flight_recorder_env(os.path.join(run_dir, "flight_recorder")))
    env.update(launcher_env)
    env.update({k: str(v) for k, v in p["env"].items()})
    env.update({k: str(v) for k, v in p["secret_env"].items()})
    # TORCHHERD_PROGRESS_FILE: a job that may stay silent for long touches it to show progress
    # (the hang watch counts it as output).
    env.update({MARKER: run_dir, "TORCHHERD_RUN_ID": p["run_id"], "PYTHONUNBUFFERED": "1",
                "TORCHHERD_PROGRESS_FILE": os.path.join(run_dir, "progress")})
    shown = dict(launcher_env, **{k: str(v) for k, v in p["env"].items()})
    shown.update({k: "********" for k in p["secret_env"]})
    return env, shown


def spawn(p, paths, argv, environ, gang=None, close=None):
    """Writes the run directory and starts torchrun under a detached supervisor; returns the
    start time once torchrun's pid is written (or 10 s have passed).

    `gang`: where the barrier ran in this call, the node's way into the gang, which the
    supervisor joins ({"sock": the master's listening socket} or {"port": the master's}).
    `close`: the firewall rule options of the rules this start opened, which the supervisor
    removes once the job has ended here (firewall.json says what it removed)."""
    os.makedirs(paths["torchrun_logs"], exist_ok=True)
    os.makedirs(paths["flight_recorder"], exist_ok=True)
    env, shown = job_env(p, paths["dir"], environ)
    write_atomic(paths["cmd"], json.dumps(argv))
    write_atomic(paths["env"], json.dumps(shown, indent=1, sort_keys=True))
    started_at = time.time()
    meta = dict(p["meta"], started_at=started_at)
    if p["wrapper"]:
        meta["wrapper"] = p["wrapper"]  # stop needs to know (see _stop)
    write_atomic(paths["meta"], json.dumps(meta))

    background = bool((p.get("barrier") or {}).get("background"))
    meeting = _meeting(p) if background or gang else None
    if gang and not background:
        meeting["met"] = gang
    first = os.fork()
    if first == 0:
        # Double fork: the supervisor is re-parented to init and outlives this SSH session.
        if os.fork() == 0:
            _supervise(argv, env, p["chdir"], paths, p["timeout"], p["grace"], meeting,
                       dict(close, run_id=p["run_id"]) if close else None)
        os._exit(0)
    os.waitpid(first, 0)
    if gang and gang.get("sock") is not None:
        gang["sock"].close()  # the supervisor's now
    # In the background the barrier may take its whole window: the supervisor is the job then.
    wanted = paths["supervisor"] if background else paths["pid"]
    deadline = time.monotonic() + 10
    while read_text(wanted) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return started_at


def _meeting(p):
    """What the supervisor needs for the barrier and the gang in the background."""
    b = p["barrier"]
    return {"master_addr": p["master_addr"], "master_port": p["master_port"],
            "run_id": p["run_id"], "listen": b["listen"], "expect": b["expect"],
            "timeout": b["timeout"], "window": b["window"], "source": b["source"] or None,
            "elastic": p["rdzv"] == "c10d",
            # Without restarts and wrapper, a worker's error is the node's: see _watch_workers.
            "watch_workers": p["max_restarts"] == 0 and not p["wrapper"],
            "name": str(p["meta"].get("host") or socket.gethostname())}


def _meet(m, paths, stop):
    """The start barrier, from the supervisor, then this node's place in the gang (_gang);
    (gang, None) or (None, why the start was called off). barrier.json keeps what it saw."""
    gang_sock = None
    if m["listen"]:
        gang_sock, error = bind(0)
        if gang_sock is None:
            return None, f"the gang's port: {error}"
    result = barrier(m["master_addr"], m["master_port"], m["run_id"], m["timeout"],
                     m["window"], listen=m["listen"], expect=m["expect"], source=m["source"],
                     gang=gang_sock)
    write_atomic(os.path.join(paths["dir"], "barrier.json"), json.dumps(result))
    if not result["go"]:
        if gang_sock is not None:
            gang_sock.close()
        why = result.get("error") or result.get("back_error") or (
            f"{result.get('served')} of {m['expect']} nodes reached the master, and "
            f"{len(result.get('back_failed') or {})} could not be reached back"
            f"{': ' + str(result['back_failed']) if result.get('back_failed') else ''}")
        return None, why
    return _join(m, gang_sock, result["gang_port"], stop, paths), None


def gang_formed(paths, joined, expected, error=None, lost=None):
    """On the master: how many of the other nodes joined its gang (gang.json), and, once its
    job ended everywhere, the nodes it lost. The wait that watches the master alone for every
    node (torchrun_job's gang option) needs all of them joined, and names the lost ones."""
    said = {"joined": joined, "expected": expected}
    if error:
        said["error"] = error
    if lost is not None:
        said["lost"] = lost
    write_atomic(paths["gang"], json.dumps(said))


def _join(m, sock, port, stop, paths):
    """This node's place in the gang once the barrier said go: the master answers on `sock`,
    every other node connects to `port` (None: the master has no gang, nor has this node)."""
    if m["listen"]:
        # Every other node connects within the barrier's own time, and then some.
        return Master(sock, m["expect"] - 1, m["window"] + 2 * m["timeout"] + 5, stop,
                      m["elastic"], lambda joined, expected: gang_formed(paths, joined, expected))
    if not port:
        return None
    gang = Member(m["master_addr"], port, m["source"], m["timeout"], stop, m["name"],
                  m["elastic"])
    if gang.error:
        _say(f"{gang.error}; this node goes on without the gang (the controller's watch "
             f"still stops it after a failure elsewhere)")
    return gang


def _supervise(argv, env, cwd, paths, timeout, grace, meeting=None, close=None):
    """Runs in the detached grandchild: (the barrier and the gang, in the background), start
    torchrun, wait, (remove the firewall rules the start opened), write the exit code."""
    os.setsid()
    write_atomic(paths["supervisor"], f"{os.getpid()} {proc_start_time(os.getpid())}")
    devnull = os.open(os.devnull, os.O_RDWR)
    log = os.open(paths["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    met = (meeting or {}).get("met")
    kept = met["sock"].fileno() if met and met.get("sock") is not None else None
    if kept is None:
        os.closerange(3, 65536)
    else:  # the master's gang socket, from the barrier in the start's own call
        os.closerange(3, kept)
        os.closerange(kept + 1, 65536)
    # From here file descriptor 1 is the node log, no longer the module's result (see _say).
    code = 127
    gang = None
    running = {}

    def stop_here(why):
        """The gang's stop: this node's job, as stop would (only while it runs)."""
        if not os.path.exists(paths["stopped"]):
            _say(f"stopping: {why}")
        proc = running.get("proc")
        if proc is None:
            write_atomic(paths["stopped"], f"{time.time()}\n")  # before the start: none
        elif proc.poll() is None:
            stop(paths, proc.pid, grace)

    try:
        if met:
            gang = _join(meeting, met.get("sock"), met.get("port"), stop_here, paths)
        elif meeting is not None:
            gang, why = _meet(meeting, paths, stop_here)
            if gang is None or os.path.exists(paths["stopped"]):
                raise _CalledOff(why or "stopped before the start")
        proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=1, stderr=2, close_fds=True)
        running["proc"] = proc
        write_atomic(paths["pid"], f"{proc.pid} {proc_start_time(proc.pid)}")
        # (pidfd: Linux 5.3 and Python 3.9; elsewhere the launcher's exit tells the gang.)
        if gang is not None and meeting.get("watch_workers") and _PIDFD_OPEN is not None:
            threading.Thread(target=_watch_workers, daemon=True,
                             args=(proc, paths, grace, gang, meeting["name"],
                                   running)).start()
        try:
            code = proc.wait(timeout=timeout or None)
        except subprocess.TimeoutExpired:
            write_atomic(paths["timed_out"], f"{time.time()}\n")
            _say(f"job timed out after {timeout} s; stopping it")
            terminate(paths["dir"], proc.pid, grace)
            code = proc.wait()
    except _CalledOff as exc:
        _say(f"the start was called off: {exc}")
        write_atomic(paths["pid"], f"{os.getpid()} {proc_start_time(os.getpid())}")
        code = 1
    except OSError as exc:
        _say(f"cannot start torchrun: {exc}")
        write_atomic(paths["pid"], f"{os.getpid()} {proc_start_time(os.getpid())}")
    finally:
        if running.get("worker_code") and code < 0:
            code = running["worker_code"]  # the launcher was ended after its worker failed
        if close is not None:
            _close_rules(close, paths)
        # ended_at first: whoever sees the exit code must find the end time too.
        meta = load_json(paths["meta"], {})
        meta["ended_at"] = time.time()
        write_atomic(paths["meta"], json.dumps(meta))
        write_atomic(paths["exit_code"], f"{code}\n")
        # The others hear of this end once it is on disk here; the master stays for theirs.
        if isinstance(gang, Master):
            gang.own_exit(code, meeting["name"])
            gang_formed(paths, len(gang.links), gang.expect, lost=list(gang.lost))
        elif gang is not None:
            gang.own_exit(code)
        os._exit(0)


def _close_rules(close, paths):
    """The start's firewall rules, removed with the firewall's own code before the exit code
    is written: whoever sees the job ended here finds the rules gone (or the error)."""
    try:
        options = {k: v for k, v in close.items() if k != "run_id"}
        closed = close_rules(ProcessRunner(_say), close["run_id"], options)
    except Exception as exc:  # the exit code must be written whatever happens here
        closed = {"changed": False, "error": f"{type(exc).__name__}: {exc}"}
    if "error" in closed:
        _say(f"the rules of run {close['run_id']} could not be removed here: {closed['error']}")
    write_atomic(paths["firewall"], json.dumps(closed))


# os.pidfd_open: Python 3.9 and later (the nodes' Python may be 3.8).
_PIDFD_OPEN = getattr(os, "pidfd_open", None)


def _watch_workers(proc, paths, grace, gang, name, running):
    """The moment a worker of the launcher ends with an error, tell the gang (the other nodes
    stop now, not once this launcher has handled the failure and ended), and end the launcher
    if it has not ended LAUNCHER_GRACE s later. The kernel wakes this thread at the worker's
    exit (a pidfd per worker); the exit code is the zombie's, read before the launcher reaps
    it, which it does at its next look (torchrun: every 0.1 s). A worker the launcher reaped
    first is left to the launcher's own exit. Workers are found once a second: the children
    whose environment names their LOCAL_RANK (torchrun, accelerate and DeepSpeed set it); any
    other child of the launcher is no rank."""
    poller = select.poll()
    watched = {}
    while proc.poll() is None:
        for pid in _children(proc.pid):
            if pid in watched.values() or not _is_rank(pid):
                continue
            try:
                fd = _PIDFD_OPEN(pid)
            except OSError:
                continue
            watched[fd] = pid
            poller.register(fd, select.POLLIN)
        for fd, _event in poller.poll(1000):
            pid = watched.pop(fd)
            poller.unregister(fd)
            code = _zombie_code(pid)
            os.close(fd)
            if code and proc.poll() is None and not os.path.exists(paths["stopped"]):
                running["worker_code"] = code
                _say(f"a worker (pid {pid}) ended with exit code {code}: the other nodes are "
                     f"told to stop")
                gang.worker_failed(code, name)
                try:
                    proc.wait(LAUNCHER_GRACE)
                except subprocess.TimeoutExpired:
                    terminate(paths["dir"], proc.pid, grace)
                return


def _is_rank(pid):
    """Whether a process is a rank: LOCAL_RANK in its environment (a child not yet through its
    exec is looked at again a second later)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return any(item.startswith(b"LOCAL_RANK=") for item in handle.read().split(b"\0"))
    except OSError:
        return False


def _children(pid):
    """Pids of a process's children (its main thread's: where a launcher starts its workers)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="utf-8") as handle:
            return [int(child) for child in handle.read().split()]
    except (OSError, ValueError):
        return []


def _zombie_code(pid):
    """The exit code of an ended, not yet reaped process (negative: the signal that ended it);
    None once it is reaped."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] != "Z" or len(fields) < 50:
        return None
    status = int(fields[49])
    return -(status & 0x7F) if status & 0x7F else (status >> 8) & 0xFF


def _say(text):
    """A line of the supervisor's own in the node log (its stdout by then), written to the file
    descriptor itself: sys.stdout may be anything the forking process had (a test's capture)."""
    os.write(1, f"torchherd: {text}\n".encode(errors="replace"))


class _CalledOff(Exception):
    """The background barrier did not say go (or the job was stopped before the start)."""
