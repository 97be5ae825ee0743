# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Starting a job on one node: torchrun's command line and environment, and the detached
supervisor that runs it and writes the run directory (see _rundir) as the job goes.

Takes the torchrun_job module's parameters as they are (p)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._container import (
    SHIM,
    container_name,
    remove,
    run_argv,
    runtime_env,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import (
    ProcessRunner,
    close_rules,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._gang import Master, Member
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS
from ansible_collections.torchherd.cluster.plugins.module_utils._probe import barrier, bind
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    MARKER,
    load_json,
    proc_start_time,
    read_state,
    read_text,
    terminate,
    write_atomic,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record
from ansible_collections.torchherd.cluster.plugins.module_utils._stacks import flight_recorder_env
from ansible_collections.torchherd.cluster.plugins.module_utils._stop import stop
from ansible_collections.torchherd.cluster.plugins.module_utils._warm import claim, dismiss
from ansible_collections.torchherd.cluster.plugins.module_utils._workers import (
    WORKER_WATCH,
    watch_workers,
)


class StartError(Exception):
    """Why the job cannot start here; `result` holds the fields that tell what is there."""

    def __init__(self, msg, **result):
        super().__init__(msg)
        self.result = result


def keep_ended_run(p, paths, state):
    """A restart (p["restart"] > 0) of a run that ended here: its run directory's files move
    to restarts/<n> inside it (n: the restart that ended it, 0 for the first launch), so that
    the job starts again in a fresh one and nothing of the earlier try is lost."""
    if not p.get("restart") or state in ("absent", "running"):
        return False
    run_dir = paths["dir"]
    kept = os.path.join(run_dir, "restarts")
    number = p["restart"] - 1
    while os.path.exists(os.path.join(kept, str(number))):
        number += 1
    staging = f"{run_dir}.restart-{os.getpid()}"
    os.rename(run_dir, staging)
    os.makedirs(kept, mode=0o755)
    earlier = os.path.join(staging, "restarts")
    if os.path.isdir(earlier):
        for name in os.listdir(earlier):
            os.rename(os.path.join(earlier, name), os.path.join(kept, name))
        os.rmdir(earlier)
    os.rename(staging, os.path.join(kept, str(number)))
    return True


def check_start(p, paths):
    """Raises StartError unless the job can start here."""
    current = read_state(paths)
    if keep_ended_run(p, paths, current["state"]):
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
    plan decided for this node, the user's launcher options, the script and its arguments; in
    the job's image, all that inside the runtime's run (container_argv)."""
    python = p["python"] or sys.executable
    argv = LAUNCHERS[p["launcher"]].argv(p, paths, python)
    argv = list(p["wrapper"]) + argv + list(p["launcher_args"]) + [p["script"]] + list(p["args"])
    return container_argv(p, paths, argv, python) if p.get("container") else argv


# Variables of the node's own environment the job's container gets too (the node's choice of
# GPUs and NCCL's and gloo's settings there); the rest of the node's environment (its PATH, its
# Python's) is the node's, not the image's.
NODE_ENV_PREFIXES = ("NCCL_", "GLOO_", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
                     "NVIDIA_VISIBLE_DEVICES")


def container_argv(p, paths, argv, python):
    """`argv` run in the job's image: the synced code (the working directory) and the run
    directory at their own paths, the job's environment by name (the values go to the runtime
    in its environment: see spawn), its secrets through standard input (SHIM)."""
    spec = p["container"]
    prefix = run_argv(spec, name=container_name(p["run_id"], p["node_rank"], p["restart"]),
                      mounts=[p["chdir"], paths["dir"]], workdir=p["chdir"],
                      env_names=container_env_names(p, paths), gpus=spec.get("gpus"),
                      stdin=bool(p["secret_env"]), volumes=spec.get("volumes") or [],
                      options=spec.get("options") or [])
    return prefix + ([python, "-c", SHIM] if p["secret_env"] else []) + argv


def container_env_names(p, paths, environ=None):
    """The variables the job's container gets: the job's own but its secrets, and the node's
    NODE_ENV_PREFIXES ones."""
    names = set(job_env(p, paths["dir"], {})[0]) - set(p["secret_env"])
    names |= {k for k in (os.environ if environ is None else environ)
              if k.startswith(NODE_ENV_PREFIXES)}
    return sorted(names)


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
    launcher_env = dict(LAUNCHERS[p["launcher"]].env(p))
    if str(p["env"].get("TORCHHERD_BACKEND")) == "nccl":
        # Every rank keeps a record of its last collectives and dumps it when asked (stacks)
        # or when its watchdog times out: where a hung job's ranks were in NCCL.
        launcher_env.update(flight_recorder_env(os.path.join(run_dir, "flight_recorder"),
                                                p["torch_version"], set(env) | set(p["env"])))
    env.update(launcher_env)
    env.update({k: str(v) for k, v in p["env"].items()})
    env.update({k: str(v) for k, v in p["secret_env"].items()})
    # TORCHHERD_PROGRESS_FILE: a job that may stay silent for long touches it to show progress
    # (the hang watch counts it as output).
    # TORCHHERD_RESTART: the whole-job restart this is (0 first), for a script that resumes.
    env.update({MARKER: run_dir, "TORCHHERD_RUN_ID": p["run_id"], "PYTHONUNBUFFERED": "1",
                "TORCHHERD_PROGRESS_FILE": os.path.join(run_dir, "progress"),
                "TORCHHERD_RESTART": str(p.get("restart") or 0)})
    shown = dict(launcher_env, **{k: str(v) for k, v in p["env"].items()})
    shown.update({k: "********" for k in p["secret_env"]})
    return env, shown


def spawn(p, paths, argv, environ, gang=None, close=None):
    """Writes the run directory and starts torchrun under a detached supervisor; returns the
    start time once torchrun's pid is written (or 10 s have passed).

    `gang`: where the barrier ran in this call, the node's way into the gang, which the
    supervisor joins ({"sock": the master's listening socket} or {"port": the master's}).
    `close`: the firewall rule options of the rules this start opened, which the supervisor
    removes once the job has ended here (the run-state record says what it removed)."""
    os.makedirs(paths["torchrun_logs"], exist_ok=True)
    os.makedirs(paths["flight_recorder"], exist_ok=True)
    env, shown = job_env(p, paths["dir"], environ)
    secrets = None
    if p.get("container"):
        # The runtime passes the job's variables on by name; the secrets it never sees: they
        # go to the shim in the image through the launcher's standard input.
        for name in p["secret_env"]:
            env.pop(name, None)
        # Where the runtime takes them from copies of its own (apptainer), those copies.
        env.update(runtime_env(p["container"], env, container_env_names(p, paths, environ)))
        secrets = json.dumps({k: str(v) for k, v in p["secret_env"].items()}) + "\n" \
            if p["secret_env"] else None
    write_atomic(paths["cmd"], json.dumps(argv))
    write_atomic(paths["env"], json.dumps(shown, indent=1, sort_keys=True))
    started_at = time.time()
    meta = dict(p["meta"], started_at=started_at)
    if p["wrapper"]:
        meta["wrapper"] = p["wrapper"]  # stop needs to know (see _stop)
    if p.get("standby") is not None:
        meta["standby"] = {"delay": float(p["standby"].get("delay") or 0)}  # see _standby_end
    if p.get("container"):
        # Stop removes the container too (see _stop), whatever ended its processes.
        meta["container"] = {
            "runtime": p["container"]["runtime"], "path": p["container"]["path"],
            "image": p["container"]["image"], "id": p["container"]["id"],
            "name": container_name(p["run_id"], p["node_rank"], p["restart"])}
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
                       dict(close, run_id=p["run_id"]) if close else None,
                       LAUNCHERS[p["launcher"]].rank_logs(p), secrets,
                       restarts=p["max_restarts"] > 0,
                       warm=bool(p.get("warm")) and not p["wrapper"] and not p.get("container"))
        os._exit(0)
    os.waitpid(first, 0)
    if gang and gang.get("sock") is not None:
        gang["sock"].close()  # the supervisor's now
    # In the background the barrier may take its whole window, and a standby waits its delay:
    # the supervisor is the job then.
    later = background or float((p.get("standby") or {}).get("delay") or 0) > 0
    wanted = paths["supervisor"] if later else paths["pid"]
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
            # Without restarts and wrapper, a worker's error is the node's: see _workers.
            "watch_workers": p["max_restarts"] == 0 and not p["wrapper"],
            "name": str(p["meta"].get("host") or socket.gethostname())}


def _meet(m, paths, stop):
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
    return _join(m, gang_sock, result["gang_port"], stop, paths), None


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


def _supervise(argv, env, cwd, paths, timeout, grace, meeting=None, close=None, rank_logs=True,
               stdin=None, restarts=False, warm=False):
    """Runs in the detached grandchild: (the barrier and the gang, in the background), start
    torchrun, wait, (remove the firewall rules the start opened), write the exit code.
    `stdin`: what the launcher reads first on its standard input (the secrets, for a launcher
    in the job's image), else it reads nothing. `warm`: the launcher may have been started
    ahead (_warm): it is handed the start, else (none there) started anew."""
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
        standby = load_json(paths["meta"], {}).get("standby")
        if standby and standby["delay"] > 0:
            _say(f"standby: the launcher starts in {standby['delay']:g} s, once the job's nodes "
                 f"have joined torchrun's rendezvous; it waits there for a node the job loses")
            until = time.monotonic() + standby["delay"]
            while time.monotonic() < until and not os.path.exists(paths["stopped"]):
                time.sleep(0.1)
            if os.path.exists(paths["stopped"]):
                raise _CalledOff("stopped before the start")
        said_before = os.fstat(1).st_size  # the node log: what follows is the launcher's
        proc = None
        if warm and not stdin:
            # The launcher started ahead in preflight, where the schedule said so (_warm).
            proc, seen = claim(paths["dir"], argv, env, cwd, paths["log"])
            record(paths, "job", warm=seen)
        if proc is None:
            proc = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True,
                                    stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                    stdout=1, stderr=2, close_fds=True)
        if stdin:
            try:
                proc.stdin.write(stdin.encode())
                proc.stdin.close()
            except OSError:
                pass  # the launcher is gone already: its exit code says why
        running["proc"] = proc
        write_atomic(paths["pid"], f"{proc.pid} {proc_start_time(proc.pid)}")
        # Where torchrun restarts the workers itself, each attempt's first output too.
        running["first_output"] = threading.Thread(target=first_output, daemon=True, args=(
            proc, paths, paths["torchrun_logs"] if rank_logs else None, said_before),
            kwargs={"attempts": restarts})
        running["first_output"].start()
        # (pidfd: Linux 5.3 and Python 3.9; elsewhere the launcher's exit tells the gang.)
        if gang is not None and meeting.get("watch_workers") and WORKER_WATCH:
            threading.Thread(target=watch_workers, daemon=True,
                             args=(proc, paths, grace, gang, meeting["name"], running,
                                   _say)).start()
        try:
            code = proc.wait(timeout=timeout or None)
        except subprocess.TimeoutExpired:
            write_atomic(paths["timed_out"], f"{time.time()}\n")
            _say(f"job timed out after {timeout} s; stopping it")
            terminate(paths["dir"], proc.pid, grace)
            code = proc.wait()
    except _CalledOff as exc:
        why = str(exc)  # the barrier's own words may say it already
        _say(why if why.startswith("the start was called off") else
             f"the start was called off: {why}")
        write_atomic(paths["pid"], f"{os.getpid()} {proc_start_time(os.getpid())}")
        code = 1
    except OSError as exc:
        _say(f"cannot start torchrun: {exc}")
        write_atomic(paths["pid"], f"{os.getpid()} {proc_start_time(os.getpid())}")
    finally:
        if running.get("worker_code") and code < 0:
            code = running["worker_code"]  # the launcher was ended after its worker failed
        if running.get("first_output"):
            running["first_output"].join(2)  # its last look, after the launcher's end
        code = _standby_end(paths, code)
        if warm and running.get("proc") is None:
            dismiss(paths["dir"])  # nothing started here: its warm launcher goes unused
        if close is not None:
            _close_rules(close, paths)
        _remove_container(paths)
        # ended_at first: whoever sees the exit code must find the end time too.
        meta = load_json(paths["meta"], {})
        meta["ended_at"] = time.time()
        write_atomic(paths["meta"], json.dumps(meta))
        record(paths, "job", exit_code=code, ended_at=meta["ended_at"])
        write_atomic(paths["exit_code"], f"{code}\n")
        # The others hear of this end once it is on disk here; the master stays for theirs.
        if isinstance(gang, Master):
            gang.own_exit(code, meeting["name"])
            gang_formed(paths, len(gang.links), gang.expect, lost=list(gang.lost),
                        lost_at=dict(gang.lost_at))
        elif gang is not None:
            gang.own_exit(code)
        os._exit(0)


def workers_started(torchrun_logs):
    """Whether torchrun started workers here: it makes an attempt_<n> directory for their
    logs each time it starts them, after its rendezvous."""
    return any(name.startswith("attempt_") for _top, dirs, _files in os.walk(torchrun_logs)
               for name in dirs)


def _standby_end(paths, code):
    """The exit code the node reports, for a job whose restarts are torchrun's (meta's
    standby). A node whose launcher ended without ever starting workers waited in torchrun's
    rendezvous as a standby the job did not need: torchrun ends it with an error once the
    rendezvous closes or its master is gone. That end is recorded (the "standby" file, and the
    record's job.standby with the launcher's own code) and reported as 0: no failure for
    the gang or the summary. A stopped node stays stopped."""
    meta = load_json(paths["meta"], {})
    if meta.get("standby") is None or os.path.exists(paths["stopped"]):
        return code
    used = workers_started(paths["torchrun_logs"])
    record(paths, "job", standby={"used": used, "launcher_exit": code})
    if used or code == 0:
        return code
    _say(f"standby: not needed (the launcher ended with exit code {code} without starting "
         f"workers: the job's rendezvous closed)")
    write_atomic(paths["standby"], f"{time.time()}\n")
    return 0


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _attempts(rank_logs):
    """{attempt number: whether a rank wrote output in it} of the attempt_<n> directories
    (torchrun starts the workers anew in each, and makes the directory as it does)."""
    found = {}
    for top, _dirs, names in os.walk(rank_logs):
        parts = os.path.relpath(top, rank_logs).split(os.sep)
        attempt = next((p for p in parts if p.startswith("attempt_")), None)
        if attempt and attempt[8:].isdigit():
            number = int(attempt[8:])
            found[number] = found.get(number, False) or any(
                name.endswith(".log") and _size(os.path.join(top, name)) > 0 for name in names)
    return found


def first_output(proc, paths, rank_logs, log_before, interval=0.1, attempts=False,
                 attempt_interval=1.0):
    """Records in the run-state record when the job first said something on this node (its
    time to first output): the first byte in a rank's own log file where the launcher writes
    them (rank_logs: torchrun, accelerate), else the node log's growth past `log_before`, its
    size at the start (DeepSpeed's launcher writes no per-rank files, so its own first line
    counts). Polls until then or until the launcher ends: a stat of a few small files, ten
    times a second.

    `attempts` (torchrun restarts its workers itself): it then looks until the launcher ends,
    once a second after the first output, and records when each attempt started here and when
    its ranks first said something (job.attempts: attempt number to started_at, output_at),
    which dates the restarted job's first output."""
    said_at = None
    seen = {}
    tracked = attempts and rank_logs is not None
    while True:
        # Whether it had ended before the look: output written before its end is seen.
        ended = proc.poll() is not None
        # The attempts first: output one of them shows, the look for the first output below
        # sees too (files only grow), so both get the same time.
        found = _attempts(rank_logs) if tracked else {}
        said = said_at is None and (
            _size(paths["log"]) > log_before if rank_logs is None else
            any(_size(os.path.join(top, name)) > 0
                for top, _dirs, names in os.walk(rank_logs) for name in names
                if name.endswith(".log")))
        # Taken after the looks: what they saw happened by then.
        now = time.time()
        if said:
            said_at = now
            record(paths, "job", first_output_at=now)
        if tracked:
            changed = False
            for number, spoke in found.items():
                if str(number) not in seen:
                    seen[str(number)] = {"started_at": now, "output_at": None}
                    changed = True
                entry = seen[str(number)]
                if spoke and entry["output_at"] is None:
                    entry["output_at"], changed = now, True
            if changed:
                record(paths, "job", attempts={k: dict(v) for k, v in seen.items()})
        elif said_at is not None:
            return
        if ended:
            return
        time.sleep(interval if said_at is None else attempt_interval)


def _remove_container(paths):
    """The job's container goes with the job (the runtime removes it on its own unless its
    processes were killed from outside)."""
    found = load_json(paths["meta"], {}).get("container")
    if found:
        said = remove(found, found["name"])
        if said:
            _say(f"container {found['name']} could not be removed: {said}")


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
    record(paths, "firewall", closed_by="supervisor", changed=bool(closed.get("changed")),
           error=closed.get("error"))


def _say(text):
    """A line of the supervisor's own in the node log (its stdout by then), written to the file
    descriptor itself: sys.stdout may be anything the forking process had (a test's capture)."""
    os.write(1, f"torchherd: {text}\n".encode(errors="replace"))


class _CalledOff(Exception):
    """The background barrier did not say go (or the job was stopped before the start)."""
