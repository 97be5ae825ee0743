# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The warm launcher: the job's launcher process started ahead, while the launch is still in
preflight, so that its own imports (torch, for torchrun: seconds on a GPU machine) are done by the
time the start comes.

node_facts starts it (``start_warm``) where the schedule says so (``start.warm``): the job's
interpreter runs ``SERVER`` from ``<root>/tools``, in a session of its own, with the run's
marker in its environment (it is a process of the run, see _rundir: stop finds it). It imports
the launcher's module and waits for the start on a socket named after the run directory (the
abstract namespace: no file, no path length limit), for at most ``deadline`` seconds; it answers
only its own user. The start's supervisor (``claim``) hands it the launcher's command line,
environment (the secrets too: never in a file, never in its command line) and directory; it
then becomes the launcher: it moves to the job's directory, takes the node log as its output
(what its import printed first, as a launcher started anew would have it there), the job's
environment as its own, and runs the module as ``python -m`` would. Its workers are
new processes, started by it with that environment, as by a launcher started anew.

Where it is not there (never started, timed out, another user's, its import failed) or its
interpreter or module are not the command line's, the supervisor starts the launcher anew: the
warm launcher only saves time, it never decides anything. What differs from a launcher started
anew: its command line (ps shows the warm launcher's), its initial environment in
/proc/<pid>/environ (the marker and the job's variables from the plan, not the secrets), and its
exit code where it is killed by a signal (the supervisor sees the socket close and takes it
for SIGKILL's).

Runs on the nodes (Python 3.8 and later)."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic
from ansible_collections.torchherd.cluster.plugins.module_utils._proc import proc_start_time
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    MARKER,
    job_pids,
    running,
)

# What the warm launcher runs. Standard library only: it runs in the job's interpreter.
SERVER = r'''"""torchherd's warm launcher (see torchherd.cluster's module_utils/_warm.py)."""
import atexit, json, os, re, runpy, signal, socket, struct, sys, tempfile, time, traceback
import warnings

_said = {}


def _send(conn, what):
    try:
        conn.sendall(json.dumps(what).encode() + b"\n")
    except OSError:
        pass


def _last_word():
    # Registered as the start came: runs after the launcher's threads ended and after the exit
    # handlers it registered since (not those its imports registered before).
    if "conn" in _said:
        _send(_said["conn"], {"code": _said.get("code", 1)})


def _killed(signum, _frame):
    # As a launcher started anew that does not handle it: dies of it (the start hears -signum).
    _said["code"] = -signum
    _last_word()
    _said.pop("conn", None)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _exit_code(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(str(code) + "\n")
    return 1


def main():
    started_at = time.time()
    module, name, deadline, argv0 = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind("\0" + name)
    except OSError:
        return 0  # one waits for this run already
    server.listen(8)
    until = time.monotonic() + deadline
    # What the import prints (DeepSpeed says which accelerator it found) is kept, and goes to
    # the node log first when the start comes, where a launcher started anew prints it.
    try:
        early = tempfile.TemporaryFile()
    except OSError:
        early = None  # no temporary directory to write to: it goes where it went (nowhere)
    if early is not None:
        os.dup2(early.fileno(), 1)
        os.dup2(early.fileno(), 2)
    error = None
    try:
        __import__(module)
    except BaseException as exc:  # the start sees it and starts the launcher anew
        error = "%s: %s" % (type(exc).__name__, exc)
    ready_at = time.time()
    while True:
        left = until - time.monotonic()
        if left <= 0:
            return 0
        server.settimeout(left)
        try:
            conn, _addr = server.accept()
        except socket.timeout:
            return 0
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  struct.calcsize("3i")))[1]
        if uid != os.getuid():
            conn.close()
            continue
        conn.settimeout(30)
        _send(conn, {"argv0": argv0, "module": module, "pid": os.getpid(), "error": error,
                     "started_at": started_at, "ready_at": ready_at})
        try:
            line = conn.makefile("rb").readline()
        except OSError:
            line = b""
        if not line or error:
            conn.close()
            if error:
                return 0
            continue  # the start went on without it; another may come within the deadline
        server.close()
        conn.settimeout(None)
        break
    job = json.loads(line)
    try:
        os.chdir(job["cwd"])
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    except OSError as exc:
        _send(conn, {"taken": False, "error": str(exc)})
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    kept = b""
    if early is not None:
        early.seek(0)
        kept = early.read()
        early.close()
    while kept:
        kept = kept[os.write(log, kept):]
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(devnull)
    os.environ.clear()
    os.environ.update(job["env"])
    sys.argv = [job["argv"][0]] + job["argv"][job["argv"].index("-m") + 2:]
    sys.path[0] = os.getcwd()  # as python -m has it
    _said["conn"] = conn
    atexit.register(_last_word)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _killed)
    _send(conn, {"taken": True, "pid": os.getpid()})
    # runpy warns that the module it runs as __main__ was imported before (here, on purpose,
    # ahead of the start): a launcher started anew does not print that, nor does this one.
    warnings.filterwarnings("ignore", category=RuntimeWarning,
                            message="'%s' found in sys.modules after import" % re.escape(module))
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        _said["code"] = 0
    except SystemExit as exc:
        _said["code"] = _exit_code(exc)
    except KeyboardInterrupt:
        _said["code"] = -2
    except BaseException:
        traceback.print_exc()
        _said["code"] = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return _said["code"]


if __name__ == "__main__":
    sys.exit(main())
'''

# How long the supervisor waits for a warm launcher that is still importing.
CLAIM_TIMEOUT = 120.0


def socket_name(run_dir):
    """The abstract socket's name of the warm launcher of a run directory."""
    digest = hashlib.sha256(os.path.abspath(run_dir).encode()).hexdigest()[:32]
    return f"torchherd-warm-{digest}"


def server_path(root):
    """Where SERVER is written on the node (once, and again where it changed)."""
    digest = hashlib.sha256(SERVER.encode()).hexdigest()[:12]
    return os.path.join(root, "tools", f"warm_launcher_{digest}.py")


def start_warm(python, module, run_dir, root, env, deadline, environ=None):
    """Starts the warm launcher of `run_dir` in the background (the job's interpreter `python`,
    `module` imported ahead, the marker and `env` in its environment); what the node's facts
    say of it: {started, pid} or {started: false, error}."""
    path = server_path(root)
    try:
        if not os.path.exists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, SERVER)
        full = dict(os.environ if environ is None else environ)
        full.update({k: str(v) for k, v in env.items()})
        full.update({MARKER: run_dir, "PYTHONUNBUFFERED": "1"})
        proc = subprocess.Popen([python, path, module, socket_name(run_dir), f"{deadline:g}", python],
                                env=full, cwd="/", start_new_session=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, close_fds=True)
    except OSError as exc:
        return {"started": False, "error": str(exc)}
    return {"started": True, "pid": proc.pid, "deadline": deadline}


class _Lines:
    """JSON lines from a socket, read with select and recv: a wait that times out leaves the
    socket usable (a file from makefile() is not, after a timeout)."""

    def __init__(self, conn):
        self.conn = conn
        self.buf = b""

    def read(self, timeout=None):
        """The next line's object; None when none came within `timeout` (None: no limit);
        {} where the socket closed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self.conn], [], [], left)[0]:
                return None
            try:
                chunk = self.conn.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                return {}
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            found = json.loads(line)
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {}


class WarmLauncher:
    """The claimed warm launcher, as the supervisor uses a subprocess.Popen: pid, poll(), wait(),
    from any thread. Its exit code comes over the socket (a thread of its own reads it); a
    socket that closes without one is a SIGKILL."""

    def __init__(self, lines, pid):
        self.pid = pid
        self.returncode = None
        self._start = proc_start_time(pid)
        self._ended = threading.Event()
        threading.Thread(target=self._read, args=(lines,), daemon=True).start()

    def _read(self, lines):
        said = lines.read(None)
        code = said.get("code")
        # The socket closes as its process exits, before the kernel has freed its memory (a
        # launcher with torch: a few tenths of a second); its end is after that, as a child's
        # wait sees it.
        while said:
            said = lines.read(None)
        lines.conn.close()
        until = time.monotonic() + 30
        while running(self.pid, self._start) and time.monotonic() < until:
            time.sleep(0.01)
        self.returncode = code if isinstance(code, int) else -signal.SIGKILL
        self._ended.set()

    def poll(self):
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout=None):
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired("warm launcher", timeout)
        return self.returncode


def launcher_module(argv):
    """(interpreter, module) of a command line that a warm launcher can run: ``python -m
    module ...``, or ``python -u -m module ...`` (the warm launcher runs unbuffered: its
    PYTHONUNBUFFERED is what ``-u`` sets). (None, None) for any other."""
    argv = [str(a) for a in argv]
    if "-m" not in argv or len(argv) < argv.index("-m") + 2:
        return None, None
    at = argv.index("-m")
    if any(flag != "-u" for flag in argv[1:at]):
        return None, None
    return argv[0], argv[at + 1]


def claim(run_dir, argv, env, cwd, log, timeout=CLAIM_TIMEOUT):
    """The run's warm launcher, handed the launcher's command line (`argv`: the interpreter,
    ``-u`` or not, ``-m``, the module, its arguments), environment and directory, once it has
    taken them: (WarmLauncher, what the run-state record keeps) or (None, why the launcher
    starts anew)."""
    since, asked_at = time.monotonic(), time.time()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lines = _Lines(conn)
    try:
        try:
            conn.connect("\0" + socket_name(run_dir))
        except (ConnectionRefusedError, FileNotFoundError):
            raise OSError("none waits for this run (not started, or its deadline passed)") from None
        hello = lines.read(timeout)
        if hello is None:
            raise OSError(f"its import took more than {timeout:g} s")
        if not hello:
            raise OSError("it closed the connection")
        if hello.get("error"):
            raise OSError(f"its import failed: {hello['error']}")
        if (hello.get("argv0"), hello.get("module")) != launcher_module(argv):
            wanted = " -m ".join(str(part) for part in launcher_module(argv))
            raise OSError(f"it runs {hello.get('argv0')} -m {hello.get('module')}, the launcher "
                          f"{wanted if launcher_module(argv)[0] else ' '.join(map(str, argv[:3]))}")
        conn.sendall(json.dumps({"argv": list(argv), "env": env, "cwd": cwd,
                                 "log": log}).encode() + b"\n")
        # No limit: once it has the start, it runs it (a second launcher must not).
        taken = lines.read(None)
        if not taken.get("taken"):
            raise OSError(taken.get("error") or "it did not take the start")
    except OSError as exc:
        conn.close()
        return None, {"used": False, "why": str(exc) or type(exc).__name__}
    pid = int(taken["pid"])
    # When it started, when its imports were done and when the start came to it (the node's
    # clock): what of the job's way to its first output the launch's own work covered.
    return WarmLauncher(lines, pid), {"used": True, "pid": pid,
                                      "waited": round(time.monotonic() - since, 3),
                                      "started_at": hello.get("started_at"),
                                      "ready_at": hello.get("ready_at"), "asked_at": asked_at}


def dismiss(run_dir):
    """Ends the run's warm launcher where the run did not start on this node (a launch that
    failed before its start here, a start called off, a node left out): every process with the
    run's marker, which only it can be then. The pids killed."""
    killed = []
    for pid in job_pids(run_dir):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed
