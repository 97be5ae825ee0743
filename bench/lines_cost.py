"""What a live view's lines cost: every node saying its last line of the job to the master over
the gang's links (module_utils/_gang), the master keeping them in its run-state record, and the
controller's wait that returns whenever they changed (the schedule's watch.lines).

    .venv/bin/python bench/lines_cost.py [--sizes 8,32] [--window 30]       # the gang, no Ansible
    flock /tmp/th-cluster.lock .venv/bin/python bench/lines_cost.py --launch --sizes 8 \\
        [--window 60] [--no-gang]                                           # the controller too

The gang (always): per size N, a master process (the supervisor's Master, its record written
into a real run directory) and one process holding the N-1 other nodes' Members, on this
machine's loopback; every node's log gets a line every 0.1 s (a chatty job: the nodes' pace,
not the job's, bounds what is said). Arms, alternating: lines (each node follows its log and
says its line; the master hands them on) and none (the gang as before: links, no lines). CPU
of each process over the window (/proc), as CPU-s per hour: the master's supervisor, and each
other node's.

The controller (--launch): per size N, a real launch of N nodes of this machine
(ansible_connection=local, as inventories/local.ini) whose job prints a line every 0.5 s on
every node, the driver in a child process, once with a live view (progress_every 5: the
master's wait returns with changed lines every second) and once without (progress_every 0:
one wait for the whole job); the CPU of the driver's process tree over the window once the
watch runs, as CPU-s per hour of job. With local nodes the wait's module runs on this machine,
inside that tree: the figure is the controller's plus the master's wait, an upper bound of the
controller's own. Prints one JSON document; --out also writes it to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "collection"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run import tree_cpu  # noqa: E402  bench/run.py: a process tree's CPU seconds

from ansible_collections.torchherd.cluster.plugins.module_utils._gang import (  # noqa: E402
    Master,
    Member,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._probe import bind  # noqa: E402
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (  # noqa: E402
    write,
)

PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")


def cpu_of(pid):
    """CPU seconds of a live process (its own and its reaped children's)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return sum(int(f) for f in raw[raw.rindex(")") + 2:].split()[11:15]) / TICK


# --- the gang ------------------------------------------------------------------------------

def master_side(members, port_file, run_dir, log, lines):
    """In a child: the master's gang with `members` others, until SIGTERM."""
    sock, error = bind(0)
    if sock is None:
        raise SystemExit(error)
    Path(port_file).write_text(str(sock.getsockname()[1]))
    paths = {"dir": run_dir}
    master = Master(sock, members, 60, lambda why: None,
                    lines=(lambda nodes: write(paths, "gang", lines=nodes)) if lines else None)
    master.follow(log, "node0")
    signal.sigwait([signal.SIGTERM])


def member_side(members, port, logs, lines):
    """In a child: `members` other nodes' links, until SIGTERM."""
    nodes = [Member("127.0.0.1", port, None, 5, lambda why: None, f"node{i + 1}")
             for i in range(members)]
    if lines:
        for node, log in zip(nodes, logs, strict=True):
            node.follow(log)
    signal.sigwait([signal.SIGTERM])


def chatter(logs, stop, every=0.1):
    """A line in every log every `every` s, as a job that prints often."""
    step = 0
    while not stop.is_set():
        for log in logs:
            with open(log, "a", encoding="utf-8") as out:
                out.write(f"[default0]:step {step} loss {1 / (step + 1):.5f}\n")
        step += 1
        stop.wait(every)


def gang_arm(n, lines, window, tmp):
    work = Path(tempfile.mkdtemp(dir=tmp))
    logs = [str(work / f"node{i}.log") for i in range(n)]
    for log in logs:
        Path(log).write_text("torchherd: started\n")
    port_file = work / "port"
    blocked = {"preexec_fn": lambda: signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])}
    master = subprocess.Popen([PY, __file__, "_master", str(n - 1), str(port_file), str(work),
                               logs[0], str(int(lines))], **blocked)
    while not port_file.exists() or not port_file.read_text():
        time.sleep(0.05)
    members = subprocess.Popen([PY, __file__, "_members", str(n - 1), port_file.read_text(),
                                json.dumps(logs[1:]), str(int(lines))], **blocked)
    stop = threading.Event()
    writer = threading.Thread(target=chatter, args=(logs, stop), daemon=True)
    writer.start()
    time.sleep(3)  # the links made, the imports done
    m0, o0, t0 = cpu_of(master.pid), cpu_of(members.pid), time.monotonic()
    time.sleep(window)
    m1, o1, t1 = cpu_of(master.pid), cpu_of(members.pid), time.monotonic()
    stop.set()
    for proc in (master, members):
        proc.terminate()
        proc.wait()
    record = json.loads((work / "run.json").read_text()) if (work / "run.json").exists() else {}
    hour = 3600 / (t1 - t0)
    return {"nodes": n, "arm": "lines" if lines else "none", "window_s": round(t1 - t0, 1),
            "master_cpu_s_per_hour": round((m1 - m0) * hour, 2),
            "node_cpu_s_per_hour": round((o1 - o0) * hour / (n - 1), 3),
            "record_writes_per_s": round((record.get("seq") or 0) / (t1 - t0 + 3), 2),
            "record_bytes": len(json.dumps(record))}


# --- the controller --------------------------------------------------------------------------

TICKS = ("import sys, time\nfor step in range(int(sys.argv[1])):\n"
         "    print(f'step {step} t={time.time():.3f}', flush=True)\n    time.sleep(0.5)\n")


def inventory(n, tmp):
    lines = ["[torchherd_nodes]"] + [
        f"node{i} ansible_host=127.0.0.{i + 1} torchherd_root={tmp}/node{i}" for i in range(n)]
    lines += ["", "[torchherd_nodes:vars]", "ansible_connection=local",
              "ansible_python_interpreter={{ ansible_playbook_python }}",
              "torchherd_firewall_enabled=false"]
    path = Path(tmp) / f"local-{n}.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def child_launch(job_json, inventory_path, runs_dir, live, marker):
    """In the child: one launch, events folded; `marker` written once the watch runs."""
    from driver.launcher import launch_async

    handle = launch_async(json.loads(job_json), inventory_path, runs_dir=runs_dir,
                          progress_every=float(live))
    retries = 0
    for event in handle.events():
        data = event.get("event_data") or {}
        task_file = str(data.get("task_path", "")).rsplit(":", 1)[0]
        if event.get("event") == "playbook_on_task_start" and \
                task_file.endswith("torchrun/tasks/wait.yml"):
            Path(marker).write_text("watch")
        if event.get("event") == "runner_retry":
            retries += 1
    result = handle.wait()
    print(json.dumps({"ok": result.ok, "run_id": result.run_id, "retries": retries}))


def launch_arm(n, live, window, tmp):
    work = Path(tempfile.mkdtemp(dir=tmp))
    (work / "code").mkdir()
    (work / "code" / "ticks.py").write_text(TICKS)
    steps = int((window + 60) / 0.5)
    job = {"script": "ticks.py", "args": [str(steps)], "code_src": str(work / "code"),
           "nproc_per_node": 1, "master_port": "auto"}
    marker = work / "watching"
    proc = subprocess.Popen([PY, __file__, "_launch", json.dumps(job),
                             str(inventory(n, work)), str(work / "runs"), str(live), str(marker)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    while not marker.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"the launch ended before its watch: {proc.stderr.read()[-3000:]}")
        time.sleep(0.2)
    time.sleep(5)  # the watch's first rounds
    c0, t0 = tree_cpu(proc.pid), time.monotonic()
    time.sleep(window)
    c1, t1 = tree_cpu(proc.pid), time.monotonic()
    ended_early = proc.poll() is not None
    out, err = proc.communicate()
    said = json.loads(out.strip().splitlines()[-1]) if out.strip() else {"error": err[-2000:]}
    return {"nodes": n, "arm": "live view" if live else "no live view", "window_s":
            round(t1 - t0, 1), "ended_early": ended_early,
            "controller_cpu_s_per_hour": round((c1 - c0) * 3600 / (t1 - t0), 1), **said}


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_master":
        return master_side(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5],
                           sys.argv[6] == "1")
    if len(sys.argv) > 1 and sys.argv[1] == "_members":
        return member_side(int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4]),
                           sys.argv[5] == "1")
    if len(sys.argv) > 1 and sys.argv[1] == "_launch":
        return child_launch(*sys.argv[2:7])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="8,32")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--launch", action="store_true",
                        help="the controller's cost too: real launches of local nodes")
    parser.add_argument("--no-gang", action="store_true", help="the controller's cost alone")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {"machine": socket.gethostname(), "cores": os.cpu_count(),
               "load_at_start": os.getloadavg()[0], "gang": [], "controller": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in [] if args.no_gang else sizes:
            for lines in (True, False):
                results["gang"].append(gang_arm(n, lines, args.window, tmp))
                print(json.dumps(results["gang"][-1]), file=sys.stderr, flush=True)
        if args.launch:
            for n in sizes:
                for live in (5, 0):
                    results["controller"].append(launch_arm(n, live, args.window, tmp))
                    print(json.dumps(results["controller"][-1]), file=sys.stderr, flush=True)
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
