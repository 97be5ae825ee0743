"""Launch latency and controller cost: bare ssh loop, pdsh, torchherd launch and relaunch.

    .venv/bin/python bench/run.py [--sizes 2,4,8,16] [--reps 3] [--reps-big 1] [--watch-nodes 8]

Builds one podman container cluster per size (tests/cluster/testbed.py), one at a time, and
measures side by side, alternating a, b, c, d, a, b, c, d, ...:

  a  ssh loop: one `ssh node torchrun --node_rank=i ...` per node in parallel (the
     launch_all_nodes.sh way); the code is copied to the nodes beforehand, untimed
  b  pdsh -R ssh: one command; a remote wrapper maps the node's own address to its rank
  c  torchherd launch (driver.launch, blocking), in a child process, after a change to the
     code (a file rewritten), so the sync really sends
  d  torchherd relaunch right after c, code unchanged, new run id

all on examples/allreduce.py with nproc_per_node 1. Per run: seconds from launch start to
every rank initialised (max of the "torchherd-init ... t=" stamps), to done, and the
controller's CPU-seconds (RUSAGE_CHILDREN delta of the launching process tree, plus the
ssh ControlPersist masters Ansible leaves behind, which are not our children).
Then the watch cost: a watched --sleep job, CPU of the driver tree over a fixed window.

Writes docs/benchmark.md, docs/benchmark.png and bench/results/*.json.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import platform
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cost  # noqa: E402  bench/cost.py, next to this file

from driver.spec import job_options  # noqa: E402
from tests.cluster import testbed  # noqa: E402

PY = sys.executable
INIT_RE = re.compile(r"torchherd-init .*?t=(\d+\.\d+)")
# Ansible's ssh multiplexing masters live in here (set for the child), so that we can find
# and charge them: after ControlPersist forks them off they are nobody's children.
CP_DIR = Path(tempfile.gettempdir()) / "thbench-cp"
METHODS = {"a": "ssh loop", "b": "pdsh", "c": "torchherd launch", "d": "torchherd relaunch"}
# e, f: c and d again with --alt-env on top (an A/B of a change, side by side).
ALT_METHODS = {"e": "launch (alt)", "f": "relaunch (alt)"}
TICK = os.sysconf("SC_CLK_TCK")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, utime+stime+cutime+cstime seconds) of a live process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[1]), sum(int(f) for f in fields[11:15]) / TICK


def mux_cpu() -> dict[int, float]:
    """CPU seconds of every live ssh ControlPersist master under CP_DIR, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(CP_DIR) in cmd and "[mux]" in cmd:
            st = _stat(int(entry.name))
            if st:
                found[int(entry.name)] = st[1]
    return found


def mux_delta(before: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in mux_cpu().items())


def tree_cpu(root: int) -> float:
    """CPU seconds of a live process and all its live descendants (incl. reaped children)."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st:
                table[int(entry.name)] = st
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            total += table[pid][1]
            todo += [p for p, (pp, _) in table.items() if pp == pid]
    return total


def ssh_base(cluster: testbed.Cluster) -> list[str]:
    return ["ssh", "-i", str(cluster.key), *testbed.SSH_OPTIONS, "-o", "ConnectTimeout=10"]


def torchrun_cmd(cluster: testbed.Cluster, port: int, rank: str) -> str:
    n = len(cluster.nodes)
    return (f"cd /root/bench && exec python3 -m torch.distributed.run --nnodes={n} "
            f"--nproc_per_node=1 --node_rank={rank} --master_addr={cluster.nodes[0].ip} "
            f"--master_port={port} allreduce.py")


def init_time(text: str) -> float | None:
    stamps = [float(t) for t in INIT_RE.findall(text)]
    return max(stamps) if stamps else None


def probe_start(ctx: dict | None) -> dict | None:
    """Before a launch: the nodes' CPU counters, and the controller's memory sampler."""
    if ctx is None:
        return None
    sampler = cost.TreeSampler(os.getpid(), str(CP_DIR))
    state = {"sampler": sampler, "nodes0": cost.node_cpu(ctx["cgroups"]),
             "t0": time.monotonic()}
    sampler.start()
    return state


def probe_end(ctx: dict | None, state: dict | None, r: dict) -> None:
    """After a launch: peak controller memory, and each node's CPU-seconds over the launch less
    what the idle node used in as long (ctx["idle"]: CPU-s per second, measured per node)."""
    if state is None or ctx is None:
        return
    after = cost.node_cpu(ctx["cgroups"])
    span = time.monotonic() - state["t0"]
    mem = state["sampler"].result()
    raw = cost.cpu_delta(state["nodes0"], after)
    node = {k: v - ctx["idle"].get(k, 0.0) * span for k, v in raw.items()}
    r.update(mem, node_cpu={k: round(v, 3) for k, v in node.items()},
             node_cpu_med=statistics.median(node.values()), node_cpu_max=max(node.values()),
             node_cpu_sum=sum(node.values()), span_s=span)


def measure_shell(method: str, cluster: testbed.Cluster, port: int,
                  ctx: dict | None = None) -> dict:
    n = len(cluster.nodes)
    probe = probe_start(ctx)
    cpu0 = children_cpu()
    t0 = time.time()
    if method == "a":
        procs = [subprocess.Popen([*ssh_base(cluster), f"root@{node.ip}",
                                   torchrun_cmd(cluster, port, str(i))],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, text=True)
                 for i, node in enumerate(cluster.nodes)]
        outs = [p.communicate()[0] for p in procs]
        rcs = [p.returncode for p in procs]
    else:
        ips = " ".join(node.ip for node in cluster.nodes)
        # pdsh runs one command everywhere: the node finds its own address in the ordered list.
        wrapper = (f"r=0; for h in {ips}; do hostname -I | tr ' ' '\\n' | grep -qx $h && break; "
                   f"r=$((r+1)); done; " + torchrun_cmd(cluster, port, "$r"))
        env = {**os.environ, "PDSH_RCMD_TYPE": "ssh",
               "PDSH_SSH_ARGS_APPEND": shlex.join(ssh_base(cluster)[1:])}
        proc = subprocess.run(["pdsh", "-R", "ssh", "-f", "64", "-l", "root", "-w",
                               ",".join(node.ip for node in cluster.nodes), wrapper],
                              capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
        outs, rcs = [proc.stdout + proc.stderr], [proc.returncode]
    done = time.time() - t0
    cpu = children_cpu() - cpu0
    text = "\n".join(outs)
    init = init_time(text)
    ok = all(rc == 0 for rc in rcs) and text.count("torchherd-allreduce ok") == n
    if not ok:
        log(f"{method} failed: rcs={rcs}\n{text[-2000:]}")
    r = {"method": method, "ok": ok, "init_s": init - t0 if init else None,
         "done_s": done, "cpu_s": cpu,
         # one ssh session per node, which starts the job: the floor
         "round_trips": {"max": 1, "min": 1, "all_started": ok}}
    probe_end(ctx, probe, r)
    return r


def measure_torchherd(method: str, cluster: testbed.Cluster, work: Path,
                      extra_env: dict[str, str], ctx: dict | None = None) -> dict:
    events = work / f"events-{method}-{time.time():.0f}.jsonl"
    job = {"script": "allreduce.py", "code_src": str(work / "code"), "nproc_per_node": 1}
    if method in "ce":
        # A full launch ships changed code: the sync really sends, as after an edit.
        (work / "code" / "version.txt").write_text(f"{time.time()}\n")
    env = {**os.environ, **extra_env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(CP_DIR)}
    before = mux_cpu()
    if ctx is not None:  # multiplexers left by the other view keep their CPUs otherwise
        cost.set_view(ctx["view"], [], {}, list(before))
    probe = probe_start(ctx)
    cpu0 = children_cpu()
    t0 = time.time()
    proc = subprocess.run([PY, __file__, "_launch", json.dumps(job), str(cluster.inventory),
                           str(work / "runs"), str(events)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    done = time.time() - t0
    cpu = children_cpu() - cpu0
    mux = mux_delta(before)
    try:
        res = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        log(f"{method} child failed rc={proc.returncode}: {proc.stderr[-3000:]}")
        r = {"method": method, "ok": False, "done_s": done, "cpu_s": cpu + mux}
        probe_end(ctx, probe, r)
        return r
    run_dir = work / "runs" / res["run_id"]
    text = "\n".join(p.read_text(errors="replace") for p in run_dir.glob("nodes/*/node.log"))
    init = init_time(text)
    summary = json.loads((run_dir / "summary.json").read_text())
    ok = res["exit_code"] == 0 and text.count("torchherd-allreduce ok") == len(cluster.nodes)
    if not ok:
        log(f"{method} failed: {res}")
    r = {"method": method, "ok": ok, "init_s": init - t0 if init else None,
         "done_s": done, "cpu_s": cpu + mux, "cpu_mux_s": mux, "run_id": res["run_id"],
         "timings": summary.get("timings"), "tasks": task_times(events),
         "round_trips": cost.round_trips(events, [nd.name for nd in cluster.nodes])}
    probe_end(ctx, probe, r)
    return r


def task_times(events: Path) -> list[list]:
    """[task, seconds] from playbook_on_task_start to the next task start (or the end)."""
    starts: list[tuple[float, str]] = []
    end = None
    for line in events.read_text().splitlines():
        ev = json.loads(line)
        if ev["event"] in ("playbook_on_task_start", "playbook_on_play_start"):
            starts.append((ev["t"], ("play: " if ev["event"] == "playbook_on_play_start" else "")
                           + ev["name"]))
        end = ev["t"]
    out = []
    for (t, name), nxt in zip(starts, [*starts[1:], (end, "")], strict=True):
        out.append([name, round(nxt[0] - t, 3)])
    return out


def child_launch(job_json: str, inventory: str, runs_dir: str, events: str) -> int:
    """In the child: one blocking driver.launch, events to a file, the result on stdout."""
    from datetime import datetime

    from driver import api
    out = open(events, "w")  # noqa: SIM115 - written by the callback, closed below

    def on_event(ev: dict) -> None:
        kind = ev.get("event", "")
        if not kind.startswith(("playbook_on_", "runner_on_")) or kind == "runner_on_start":
            return
        data = ev.get("event_data", {})
        stamp = datetime.fromisoformat(ev["created"]).timestamp() if ev.get("created") else 0
        name = data.get("task") or data.get("play") or ""
        rec = {"t": stamp, "event": kind, "name": name}
        if kind.startswith("runner_on_") or kind == "playbook_on_task_start":
            res = data.get("res") if isinstance(data.get("res"), dict) else {}
            rec.update(host=data.get("host"), action=data.get("resolved_action")
                       or data.get("task_action"), path=data.get("task_path"),
                       delegated=bool(res.get("_ansible_delegated_vars")
                                      or data.get("delegated_host")))
        out.write(json.dumps(rec) + "\n")
        out.flush()  # the parent waits for the watch play in this file

    result = api.launch(json.loads(job_json), inventory, runs_dir=runs_dir, on_event=on_event)
    out.close()
    print(json.dumps({"run_id": result.run_id, "exit_code": int(result.exit_code)}))
    return 0


def measure_watch(cluster: testbed.Cluster, work: Path, window: float, sleep: float,
                  extra_env: dict[str, str], interval: int | None = None) -> dict:
    """A watched job of `sleep` seconds: CPU of the driver tree over `window` seconds."""
    events = work / f"events-watch-{interval}.jsonl"
    job = {"script": "allreduce.py", "code_src": str(work / "code"), "nproc_per_node": 1,
           "args": ["--sleep", str(sleep)]}
    if interval:
        job["watch_interval"] = interval
    env = {**os.environ, **extra_env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(CP_DIR)}
    proc = subprocess.Popen([PY, __file__, "_launch", json.dumps(job), str(cluster.inventory),
                             str(work / "runs"), str(events)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=ROOT)
    while True:  # wait for the watch play
        time.sleep(0.5)
        if events.exists() and '"Watch"' in events.read_text():
            break
        if proc.poll() is not None:
            raise RuntimeError(f"watch launch ended early: {proc.stderr.read()[-2000:]}")
    time.sleep(5)  # let the first watch round begin
    before_mux = mux_cpu()
    c0, t0 = tree_cpu(proc.pid), time.monotonic()
    time.sleep(window)
    c1, t1 = tree_cpu(proc.pid), time.monotonic()
    mux = mux_delta(before_mux)
    if proc.poll() is not None:
        raise RuntimeError("the watched launch ended inside the measuring window: "
                           "raise --watch-sleep above the window")
    proc.communicate()
    cpu = c1 - c0 + mux
    n = len(cluster.nodes)
    default = job_options()["watch_interval"]["default"]
    return {"nodes": n, "watch_interval": interval or default, "window_s": t1 - t0, "cpu_s": cpu,
            "cpu_mux_s": mux, "cpu_per_node_hour": cpu / (t1 - t0) * 3600 / n}


def machine() -> dict:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu": model, "loadavg": os.getloadavg(), "commit": commit,
            "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                       time.gmtime())}


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def measure_idle(cgroups: dict[str, str], seconds: float = 5.0) -> dict[str, float]:
    """Each node's CPU-seconds per second while nothing runs on it (systemd, journald)."""
    a = cost.node_cpu(cgroups)
    time.sleep(seconds)
    return {k: v / seconds for k, v in cost.cpu_delta(a, cost.node_cpu(cgroups)).items()}


def run_size(n: int, reps: int, work: Path, methods: str, extra_env: dict[str, str],
             watch: dict | None, alt_env: dict[str, str] | None = None,
             views: tuple[str, ...] = ("shared",), min_mem_gib: float = 2.0) -> dict:
    name = f"bench{n}"
    log(f"up {name} ({n} nodes), free memory {mem_available_gib():.1f} GiB")
    t_up = time.monotonic()
    cluster = testbed.up(name, n)
    up_s = time.monotonic() - t_up
    results: list[dict] = []
    watch_res = []
    names = [node.name for node in cluster.nodes]
    cgroups = cost.container_cgroups(names)
    mem_low = mem_available_gib()
    idle_by_view = {}
    try:
        for node in cluster.nodes:  # a and b expect the code on the nodes already
            subprocess.run([*ssh_base(cluster), f"root@{node.ip}", "mkdir -p /root/bench"],
                           check=True)
            subprocess.run(["scp", "-q", "-i", str(cluster.key), *testbed.SSH_OPTIONS,
                            str(work / "code" / "allreduce.py"),
                            f"root@{node.ip}:/root/bench/"], check=True)
        port = 29600
        for view in views:
            cost.set_view(view, names, cgroups, list(mux_cpu()))
            idle = measure_idle(cgroups)
            idle_by_view[view] = statistics.median(idle.values())
            ctx = {"view": view, "cgroups": cgroups, "idle": idle}
            log(f"view {view}: idle node CPU {idle_by_view[view]:.4f} CPU-s/s per node")
            for rep in range(reps):
                for m in methods:
                    free = mem_available_gib()
                    mem_low = min(mem_low, free)
                    if free < min_mem_gib:
                        log(f"only {free:.1f} GiB free: skipping {view} rep {rep} {m}")
                        continue
                    port += 1
                    if m in "ab":
                        r = measure_shell(m, cluster, port, ctx)
                    elif m in ALT_METHODS:
                        r = measure_torchherd(m, cluster, work,
                                              {**extra_env, **(alt_env or {})}, ctx)
                    else:
                        r = measure_torchherd(m, cluster, work, extra_env, ctx)
                    r.update(nodes=n, rep=rep, view=view)
                    results.append(r)
                    rt = r.get("round_trips") or {}
                    log(f"n={n} {view} rep={rep} {m}: init {r.get('init_s') or 0:.2f} s done "
                        f"{r['done_s']:.2f} s cpu {r['cpu_s']:.2f} s "
                        f"mem {r.get('peak_rss_mb', 0):.0f} MB node cpu/node "
                        f"{r.get('node_cpu_med', 0):.2f} s trips {rt.get('max')} ok={r['ok']}")
            if view == views[0]:
                # With --alt-env, the watch of the other collection too, alternating (an A/B).
                arms = [("", extra_env)] + ([("alt", {**extra_env, **alt_env})]
                                            if alt_env else [])
                for _rep in range(watch["reps"] if watch else 0):
                    for interval in watch["intervals"]:
                        for arm, env in arms:
                            w = measure_watch(cluster, work, watch["window"], watch["sleep"],
                                              env, interval)
                            w["arm"] = arm
                            w["view"] = view
                            watch_res.append(w)
                            log(f"watch{' ' + arm if arm else ''}: {w}")
    finally:
        cost.set_view("shared", [], {}, [])
        t_down = time.monotonic()
        testbed.down(name)
        down_s = time.monotonic() - t_down
    return {"nodes": n, "runs": results, "watch": watch_res, "idle_node_cpu": idle_by_view,
            "up_s": up_s, "down_s": down_s, "mem_available_min_gib": mem_low}


def med(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(sizes: list[dict]) -> list[dict]:
    """One row per view and size: medians over the repetitions of every method; the nodes'
    own CPU of torchherd (own_node_cpu: per node, the method's median less pdsh's, then the
    median and max over the nodes)."""
    rows = []
    for s in sizes:
        views = list(dict.fromkeys(r.get("view", "shared") for r in s["runs"])) or ["shared"]
        for view in views:
            n, row = s["nodes"], {"nodes": s["nodes"], "view": view}
            vruns = [r for r in s["runs"] if r.get("view", "shared") == view]
            for m in METHODS:
                runs = [r for r in vruns if r["method"] == m and r["ok"]]
                row[m] = {"n": len(runs), "init_s": med([r.get("init_s") for r in runs]),
                          "done_s": med([r["done_s"] for r in runs]),
                          "cpu_s": med([r["cpu_s"] for r in runs]),
                          "peak_rss_mb": med([r.get("peak_rss_mb") for r in runs]),
                          "node_cpu_med": med([r.get("node_cpu_med") for r in runs]),
                          "trips": max((r["round_trips"]["max"] for r in runs
                                        if r.get("round_trips")), default=None),
                          "serial_cpu": med([sum((r.get("serial_cpu") or {}).values())
                                             for r in runs if "serial_cpu" in r])}
                if row[m]["cpu_s"] is not None:
                    row[m]["cpu_per_node"] = row[m]["cpu_s"] / n
                if row[m]["peak_rss_mb"] is not None:
                    row[m]["rss_per_node_mb"] = row[m]["peak_rss_mb"] / n
            base = {}
            for r in vruns:
                if r["method"] == "b" and r["ok"] and r.get("node_cpu"):
                    for host, v in r["node_cpu"].items():
                        base.setdefault(host, []).append(v)
            for m in "acd":
                per_host = {}
                for r in vruns:
                    if r["method"] == m and r["ok"] and r.get("node_cpu"):
                        for host, v in r["node_cpu"].items():
                            per_host.setdefault(host, []).append(v)
                own = [med(v) - med(base[h]) for h, v in per_host.items() if base.get(h)]
                if own:
                    row[m]["own_node_cpu"] = med(own)
                    row[m]["own_node_cpu_max"] = max(own)
            rows.append(row)
    return rows


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def write_markdown(path: Path, info: dict, rows: list[dict], sizes: list[dict],
                   note: str) -> None:
    lines = [
        "# Benchmark: launch latency and controller cost",
        "",
        "Generated by `bench/run.py` (see bench/README.md). " + note,
        "",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), load average at start "
        f"{' '.join(f'{x:.2f}' for x in info['loadavg'])}, {info['date']}. Nodes are podman "
        "containers on this same machine, reached over real SSH; they share its CPUs, so the "
        "floor (torch import and init on every node) grows with the node count.",
        "",
        "allreduce.py, one process per node. Medians; seconds from launch start. "
        "a = parallel ssh loop, b = pdsh, c = torchherd launch, d = torchherd relaunch "
        "(code unchanged). CPU = controller CPU-seconds of the launching process tree.",
        "",
        "| nodes | reps | init a/b/c/d | done a | done b | done c | done d | c/b | d/b "
        "| c-b (s) | d-b (s) | CPU/node b | CPU/node c | CPU/node d |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        b = row["b"]["done_s"]
        c, d = row["c"]["done_s"], row["d"]["done_s"]
        inits = "/".join(fmt(row[m]["init_s"], ".1f") for m in METHODS)
        lines.append(
            f"| {row['nodes']} | {row['c']['n']} | {inits} | {fmt(row['a']['done_s'])} "
            f"| {fmt(b)} | {fmt(c)} | {fmt(d)} | {fmt(c / b if c and b else None)} "
            f"| {fmt(d / b if d and b else None)} "
            f"| {fmt(c - b if c and b else None)} | {fmt(d - b if d and b else None)} "
            f"| {fmt(row['b'].get('cpu_per_node'), '.3f')} "
            f"| {fmt(row['c'].get('cpu_per_node'), '.3f')} "
            f"| {fmt(row['d'].get('cpu_per_node'), '.3f')} |")
    watches = [w for s in sizes for w in s.get("watch") or []]
    for w in watches:
        arm = " (the other collection, --alt-env)" if w.get("arm") else ""
        lines += ["", f"Watching a running job{arm} ({w['nodes']} nodes, watch_interval "
                  f"{w['watch_interval']} s, "
                  f"{w['window_s']:.0f} s window): {w['cpu_s']:.2f} CPU-s "
                  f"(of which ssh multiplexers {w['cpu_mux_s']:.2f}) = "
                  f"**{w['cpu_per_node_hour']:.1f} CPU-s per node per hour**. "
                  "A detached job costs the controller nothing after the launch."]
    # profile at the largest size with c runs
    prof = [s for s in sizes if any(r["method"] == "c" and r["ok"] for r in s["runs"])]
    if prof:
        s = next((x for x in prof if x["nodes"] == 8), prof[-1])
        for m in "cd":
            runs = [r for r in s["runs"] if r["method"] == m and r["ok"]]
            if not runs:
                continue
            lines += ["", f"## Profile of {METHODS[m]} at {s['nodes']} nodes (median of "
                      f"{len(runs)})", "", "Phase timings (summary.json):", "",
                      "| phase | s |", "|---|---|"]
            order = ["plan", "preflight", "sync", "firewall", "start", "watch", "collect",
                     "total"]
            phases = sorted((runs[0].get("timings") or {}).keys(),
                            key=lambda k: order.index(k) if k in order else len(order))
            for ph in phases:
                vals = [r["timings"].get(ph) for r in runs if r.get("timings")]
                vals = [v for v in vals if isinstance(v, (int, float))]
                lines.append(f"| {ph} | {fmt(med(vals))} |")
            lines += ["", "Per task (start to next task start, ansible-runner events):", "",
                      "| task | s |", "|---|---|"]
            names = [t[0] for t in runs[0]["tasks"]]
            for i, name in enumerate(names):
                vals = [r["tasks"][i][1] for r in runs
                        if len(r["tasks"]) > i and r["tasks"][i][0] == name]
                lines.append(f"| {name} | {fmt(med(vals))} |")
    path.write_text("\n".join(lines) + "\n")


def write_plot(path: Path, rows: list[dict]) -> None:
    try:
        import matplotlib
    except ImportError:
        subprocess.run([PY, "-m", "pip", "install", "-q", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [r["nodes"] for r in rows]
    for m, label in METHODS.items():
        ax1.plot(xs, [r[m]["done_s"] for r in rows], marker="o", label=f"{m}: {label}")
        ax2.plot(xs, [r[m].get("cpu_per_node") for r in rows], marker="o", label=label)
    ax1.set(xlabel="nodes", ylabel="seconds to done (median)", title="Launch to done")
    ax2.set(xlabel="nodes", ylabel="controller CPU-s per node", title="Controller cost")
    ax2.axhline(0.5, color="grey", ls="--", lw=0.8)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


@contextlib.contextmanager
def heavy_lock(take: bool):
    """The machine's lock for clusters of 8 nodes and more (other sessions run big test
    clusters on it too): held for the whole size, bring-up and teardown included."""
    if not take:
        yield
        return
    with open("/tmp/torchherd-heavy.lock", "a") as handle:
        log("waiting for /tmp/torchherd-heavy.lock")
        fcntl.flock(handle, fcntl.LOCK_EX)
        log("holding /tmp/torchherd-heavy.lock")
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_launch":
        return child_launch(*sys.argv[2:6])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="2,4,8,16")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--reps-big", type=int, default=1, help="repetitions at 16 nodes and more")
    p.add_argument("--methods", default="abcd")
    p.add_argument("--watch-nodes", type=int, default=8, help="0: skip the watch measurement")
    p.add_argument("--watch-window", type=float, default=120.0)
    p.add_argument("--watch-sleep", type=float, default=170.0)
    p.add_argument("--watch-reps", type=int, default=1)
    p.add_argument("--watch-intervals", default="0",
                   help="watch_interval values to measure; 0 is the job's default")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="extra environment for torchherd (e.g. ANSIBLE_CONFIG=...)")
    p.add_argument("--alt-env", action="append", default=[], metavar="K=V",
                   help="environment of methods e, f (e.g. TORCHHERD_COLLECTIONS_PATH=...)")
    p.add_argument("--separate-cores", action="store_true",
                   help="also measure with the controller on CPU 0 and the nodes on CPU 1")
    p.add_argument("--separate-max", type=int, default=16,
                   help="largest size measured in the separate-cores view too")
    p.add_argument("--lock-from", type=int, default=8,
                   help="hold /tmp/torchherd-heavy.lock (flock) around sizes of this many nodes "
                        "and more, bring-up and teardown included")
    p.add_argument("--min-mem-gib", type=float, default=2.0,
                   help="skip a run when less memory than this is available")
    p.add_argument("--tag", default="", help="results file suffix; docs only when empty")
    p.add_argument("--note", default="")
    p.add_argument("--from", dest="from_json", metavar="RESULTS",
                   help="only write the docs from an earlier bench/results/*.json")
    args = p.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        rows = summarize(saved["sizes"])
        write_markdown(ROOT / "docs" / "benchmark.md", saved["machine"], rows, saved["sizes"],
                       args.note)
        write_plot(ROOT / "docs" / "benchmark.png", rows)
        print(json.dumps(rows, indent=1))
        return 0
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    alt_env = dict(kv.split("=", 1) for kv in args.alt_env)
    if not shutil.which("pdsh") and "b" in args.methods:
        raise SystemExit("pdsh not found: apt-get install -y pdsh")
    info = machine()
    log(f"machine: {info}")
    work = Path(tempfile.mkdtemp(prefix="thbench-"))
    (work / "code").mkdir()
    shutil.copy(ROOT / "examples" / "allreduce.py", work / "code" / "allreduce.py")
    CP_DIR.mkdir(exist_ok=True)
    sizes = []
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in [int(x) for x in args.sizes.split(",")]:
        reps = args.reps if n < 16 else args.reps_big
        watch = {"window": args.watch_window, "sleep": args.watch_sleep,
                 "intervals": [int(x) for x in args.watch_intervals.split(",")],
                 "reps": args.watch_reps} if n == args.watch_nodes else None
        views = ("shared", "separate") if args.separate_cores and n <= args.separate_max \
            else ("shared",)
        with heavy_lock(n >= args.lock_from):
            sizes.append(run_size(n, reps, work, args.methods, extra_env, watch, alt_env,
                                  views, args.min_mem_gib))
        (out_dir / f"{stamp}{args.tag}.json").write_text(
            json.dumps({"machine": info, "env": extra_env, "alt_env": alt_env, "sizes": sizes},
                       indent=1))
    rows = summarize(sizes)
    if not args.tag:
        write_markdown(ROOT / "docs" / "benchmark.md", info, rows, sizes, args.note)
        write_plot(ROOT / "docs" / "benchmark.png", rows)
    print(json.dumps(rows, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
