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

Per launch also (bench/cost.py): the controller's peak memory (sum of RSS of the launching
tree and the ssh multiplexers, every 50 ms), each node container's own CPU (cgroup) less the
same job's under pdsh, the round trips to a node before the start (from the child's
ansible-runner events), and a model of the overhead on a real cluster fitted to them.
--separate-cores adds a second view: the controller on CPU 0, the node containers on CPU 1.
Sizes of --lock-from nodes and more hold /tmp/torchherd-heavy.lock (the machine is shared).

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
import delay  # noqa: E402  bench/delay.py: --delay-ms

from driver.spec import job_options  # noqa: E402
from tests.cluster import testbed  # noqa: E402
from tests.cluster.wheels import pure_wheel, uv_wheel  # noqa: E402

PY = sys.executable
INIT_RE = re.compile(r"torchherd-init .*?t=(\d+\.\d+)")
# Ansible's ssh multiplexing masters live in here (set for the child), so that we can find
# and charge them: after ControlPersist forks them off they are nobody's children.
CP_DIR = Path(tempfile.gettempdir()) / "thbench-cp"
METHODS = {"a": "ssh loop", "b": "pdsh", "c": "torchherd launch", "d": "torchherd relaunch"}
# e, f: c and d again with --alt-env on top, in the job image (--alt-container) or in a locked
# venv (--alt-venv): an A/B of a change, side by side.
VENV_WHEELS = "/srv/bench-wheels"
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
    for pid in delay.mux_pids(CP_DIR):
        st = _stat(pid)
        if st:
            found[pid] = st[1]
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


def ssh_base(cluster: testbed.Cluster, relay: dict | None = None) -> list[str]:
    """ssh to a node; through the delaying relay's ssh_config with --delay-ms."""
    cfg = ["-F", str(relay["config"])] if relay else []
    return ["ssh", *cfg, "-i", str(cluster.key), *testbed.SSH_OPTIONS, "-o", "ConnectTimeout=10"]


def torchrun_cmd(cluster: testbed.Cluster, port: int, rank: str) -> str:
    n = len(cluster.nodes)
    return (f"cd /root/bench && exec python3 -m torch.distributed.run --nnodes={n} "
            f"--nproc_per_node=1 --node_rank={rank} --master_addr={cluster.nodes[0].ip} "
            f"--master_port={port} allreduce.py")


def init_time(text: str) -> float | None:
    stamps = [float(t) for t in INIT_RE.findall(text)]
    return max(stamps) if stamps else None


def probe_start(ctx: dict | None, muxes: bool = True) -> dict | None:
    """Before a launch: the nodes' CPU counters, and the controller's memory sampler (with
    the ssh multiplexers of torchherd's Ansible unless `muxes` is false: a and b use none)."""
    if ctx is None:
        return None
    sampler = cost.TreeSampler(os.getpid(), str(CP_DIR) if muxes else "")
    cost.node_mem_reset(ctx["cgroups"])
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
    node_mem = cost.node_mem_peak(ctx["cgroups"])
    if node_mem:
        r.update(node_mem_peak_mb=statistics.median(node_mem.values()),
                 node_mem_peak_max_mb=max(node_mem.values()))
    r.update(mem, node_cpu={k: round(v, 3) for k, v in node.items()},
             node_cpu_med=statistics.median(node.values()), node_cpu_max=max(node.values()),
             node_cpu_sum=sum(node.values()), span_s=span)


def measure_shell(method: str, cluster: testbed.Cluster, port: int,
                  ctx: dict | None = None, relay: dict | None = None) -> dict:
    n = len(cluster.nodes)
    base_env = delay.shell_env(dict(os.environ), relay["tag"]) if relay else dict(os.environ)
    before_relay = delay.snapshot(relay["stats"], relay["prefix"]) if relay else {}
    probe = probe_start(ctx, muxes=False)
    cpu0 = children_cpu()
    t0 = time.time()
    if method == "a":
        procs = [subprocess.Popen([*ssh_base(cluster, relay), f"root@{node.ip}",
                                   torchrun_cmd(cluster, port, str(i))],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, text=True, env=base_env)
                 for i, node in enumerate(cluster.nodes)]
        outs = [p.communicate()[0] for p in procs]
        rcs = [p.returncode for p in procs]
    else:
        ips = " ".join(node.ip for node in cluster.nodes)
        # pdsh runs one command everywhere: the node finds its own address in the ordered list.
        wrapper = (f"r=0; for h in {ips}; do hostname -I | tr ' ' '\\n' | grep -qx $h && break; "
                   f"r=$((r+1)); done; " + torchrun_cmd(cluster, port, "$r"))
        env = {**base_env, "PDSH_RCMD_TYPE": "ssh",
               "PDSH_SSH_ARGS_APPEND": shlex.join(ssh_base(cluster, relay)[1:])}
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
         "round_trips": {"max": 1, "min": 1, "total_max": 1, "all_started": ok}}
    probe_end(ctx, probe, r)
    if relay:
        add_relay(r, relay, before_relay)
    return r


def add_relay(r: dict, relay: dict, before: dict) -> None:
    """The relay's counters of this launch. The relays' own CPU is not in the launch's CPU
    measure: ssh does not reap its ProxyCommand (10 ssh sessions to a node here took 0.94
    CPU-s of children directly, 0.97 through the relay, whose own CPU was 0.28)."""
    r["relay"] = delay.counters(relay["stats"], relay["prefix"], before)
    r["delay_ms"] = relay["rtt_ms"]
    r["relay_tag"] = relay["tag"]


def measure_torchherd(method: str, cluster: testbed.Cluster, work: Path,
                      extra_env: dict[str, str], ctx: dict | None = None,
                      job_extra: dict | None = None, relay: dict | None = None) -> dict:
    events = work / f"events-{method}-{time.time():.0f}.jsonl"
    job = {"script": "allreduce.py", "code_src": str(work / "code"), "nproc_per_node": 1,
           **(job_extra or {})}
    if method in "ce":
        # A full launch ships changed code: the sync really sends, as after an edit.
        (work / "code" / "version.txt").write_text(f"{time.time()}\n")
    env = {**os.environ, **extra_env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(CP_DIR)}
    inventory, cwd = str(cluster.inventory), ROOT
    if relay:
        # No Ansible configuration of the user's: an empty working directory, no ANSIBLE_CONFIG.
        env = delay.torchherd_env(dict(os.environ), extra_env, relay["tag"], relay["cp_dir"])
        inventory, cwd = str(relay["inventory"]), work / "no-ansible-cfg"
        cwd.mkdir(exist_ok=True)
        if method == "g":  # a relaunch that opens new SSH connections
            relay["masters_ended"] = delay.cold(relay["cp_dir"])
        before_relay = delay.snapshot(relay["stats"], relay["prefix"])
    before = mux_cpu()
    if ctx is not None:  # multiplexers left by the other view keep their CPUs otherwise
        cost.set_view(ctx["view"], [], {}, list(before))
    probe = probe_start(ctx)
    cpu0 = children_cpu()
    t0 = time.time()
    proc = subprocess.run([PY, __file__, "_launch", json.dumps(job), inventory,
                           str(work / "runs"), str(events)],
                          capture_output=True, text=True, env=env, cwd=cwd)
    done = time.time() - t0
    cpu = children_cpu() - cpu0
    mux = mux_delta(before)
    try:
        res = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        log(f"{method} child failed rc={proc.returncode}: {proc.stderr[-3000:]}")
        r = {"method": method, "ok": False, "done_s": done, "cpu_s": cpu + mux}
        probe_end(ctx, probe, r)
        if relay:
            add_relay(r, relay, before_relay)
        return r
    run_dir = work / "runs" / res["run_id"]
    text = "\n".join(p.read_text(errors="replace") for p in run_dir.glob("nodes/*/node.log"))
    init = init_time(text)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):  # stopped before the summary (preflight failed)
        summary = {}
    ok = res["exit_code"] == 0 and text.count("torchherd-allreduce ok") == len(cluster.nodes)
    problems = ""
    if not ok:
        with contextlib.suppress(OSError, json.JSONDecodeError, AttributeError):
            gate = json.loads((run_dir / "preflight.json").read_text()).get("gate") or {}
            problems = "; ".join(f"{x.get('host')}: {x.get('found')}"
                                 for x in gate.get("problems") or [])[:600]
        log(f"{method} failed: {res} {problems}")
    r = {"method": method, "ok": ok, "init_s": init - t0 if init else None,
         "done_s": done, "cpu_s": cpu + mux, "cpu_mux_s": mux, "run_id": res["run_id"],
         "timings": summary.get("timings"), "tasks": task_times(events),
         "round_trips": cost.round_trips(events, [nd.name for nd in cluster.nodes])}
    if not ok:
        r["failure"] = f"exit code {res['exit_code']}: {summary.get('reason') or problems}"[:300]
    probe_end(ctx, probe, r)
    if relay:
        add_relay(r, relay, before_relay)
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
                            text=True, cwd=ROOT).stdout.strip() or os.environ.get("BENCH_COMMIT")
    full = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT).stdout.strip() or None
    return {"nproc": os.cpu_count(), "cpu": model, "loadavg": os.getloadavg(), "commit": commit,
            "commit_full": full,
            "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                       time.gmtime())}


def measure_idle(cgroups: dict[str, str], seconds: float = 5.0) -> dict[str, float]:
    """Each node's CPU-seconds per second while nothing runs on it (systemd, journald)."""
    a = cost.node_cpu(cgroups)
    time.sleep(seconds)
    return {k: v / seconds for k, v in cost.cpu_delta(a, cost.node_cpu(cgroups)).items()}


def run_size(n: int, reps: int, work: Path, methods: str, extra_env: dict[str, str],
             watch: dict | None, alt_env: dict[str, str] | None = None,
             views: tuple[str, ...] = ("shared",), min_mem_gib: float = 2.0,
             alt_job: dict | None = None, relays: dict[float, dict] | None = None) -> dict:
    name = f"bench{n}"
    log(f"up {name} ({n} nodes), free memory {cost.mem_available_gib():.1f} GiB")
    t_up = time.monotonic()
    try:  # 64 systemd containers on two cores take more than the default minute to boot
        cluster = testbed.up(name, n, timeout=max(60.0, 5.0 * n),
                             container_runtime=bool((alt_job or {}).get("container")))
    except BaseException:
        testbed.down(name)
        raise
    up_s = time.monotonic() - t_up
    if (alt_job or {}).get("venv"):
        # The venv's wheelhouse on every node (uv's own wheel too: the nodes have no uv).
        for node in cluster.nodes:
            testbed.podman("exec", node.name, "mkdir", "-p", VENV_WHEELS)
            for wheel in (work / "wheels").iterdir():
                testbed.podman("cp", str(wheel), f"{node.name}:{VENV_WHEELS}/")
    results: list[dict] = []
    watch_res = []
    names = [node.name for node in cluster.nodes]
    cgroups = cost.container_cgroups(names)
    mem_low = cost.mem_available_gib()
    idle_by_view = {}
    try:
        for node in cluster.nodes:  # a and b expect the code on the nodes already
            subprocess.run([*ssh_base(cluster), f"root@{node.ip}", "mkdir -p /root/bench"],
                           check=True)
            subprocess.run(["scp", "-q", "-i", str(cluster.key), *testbed.SSH_OPTIONS,
                            str(work / "code" / "allreduce.py"),
                            f"root@{node.ip}:/root/bench/"], check=True)
        port = 29600
        stopped = False
        warmup = None
        if relays:
            # Each delay's inventory: the cluster's, ssh through that delay's ssh_config.
            for d, relay in relays.items():
                relay["inventory"] = delay.inventory(
                    cluster.inventory, work / f"inventory-{n}-{delay.label(d)}ms.ini",
                    relay["config"])
                # torchherd's ssh multiplexers of this size and delay, kept between launches
                relay["cp_dir"] = relay["cp_base"] / f"n{n}-{delay.label(d)}ms"
            # One launch untimed: the code's first sync and the torch probe's cache, so that
            # every d measured is a relaunch.
            first = relays[min(relays)]
            log(f"n={n}: an untimed first launch ({delay.label(first['rtt_ms'])} ms)")
            lab = delay.label(first["rtt_ms"])
            warmup = measure_torchherd("c", cluster, work, extra_env,
                                       relay={**first, "tag": f"th-n{n}-{lab}ms-warmup",
                                              "prefix": f"th-n{n}-{lab}ms-"})
            log(f"n={n} first launch: done {warmup['done_s']:.2f} s ok={warmup['ok']} "
                f"relay {warmup.get('relay')}")
        for view in views:
            cost.set_view(view, names, cgroups, list(mux_cpu()))
            idle = measure_idle(cgroups)
            idle_by_view[view] = statistics.median(idle.values())
            ctx = {"view": view, "cgroups": cgroups, "idle": idle}
            log(f"view {view}: idle node CPU {idle_by_view[view]:.4f} CPU-s/s per node")
            # --delay-ms: every repetition runs every delay, each every method.
            arms = [(d, m) for d in relays for m in methods] if relays else \
                [(None, m) for m in methods]
            for rep in range(reps):
                for d, m in arms:
                    free = cost.mem_available_gib()
                    mem_low = min(mem_low, free)
                    if free < min_mem_gib:
                        log(f"only {free:.1f} GiB free: skipping {view} rep {rep} {m}")
                        continue
                    port += 1
                    relay = None
                    if relays:
                        who = f"{'sh' if m in 'ab' else 'th'}-n{n}-{delay.label(d)}ms-"
                        tag = f"{who}r{rep}-{m}"
                        # pdsh's connections are its own; torchherd's may be the launch before
                        # it's (ssh multiplexers): counted as what changed during the launch
                        relay = {**relays[d], "tag": tag, "prefix": tag if m in "ab" else who}
                    try:
                        if m in "ab":
                            r = measure_shell(m, cluster, port, ctx, relay)
                        elif relay:
                            r = measure_torchherd(m, cluster, work, extra_env, ctx, relay=relay)
                        elif m in ALT_METHODS:
                            r = measure_torchherd(m, cluster, work,
                                                  {**extra_env, **(alt_env or {})}, ctx,
                                                  alt_job)
                        else:
                            r = measure_torchherd(m, cluster, work, extra_env, ctx)
                    except Exception as exc:  # noqa: BLE001 - one bad run must not end the size
                        log(f"{m} raised {exc!r}")
                        r = {"method": m, "ok": False, "done_s": 0.0, "cpu_s": 0.0,
                             "error": repr(exc)}
                    r.update(nodes=n, rep=rep, view=view)
                    results.append(r)
                    mem_low = min(mem_low, r.get("mem_available_min_gib", mem_low))
                    rt = r.get("round_trips") or {}
                    rl = r.get("relay") or {}
                    log(f"n={n} {view}{f' {d:g} ms' if relay else ''} rep={rep} {m}: init "
                        f"{r.get('init_s') or 0:.2f} s done "
                        f"{r['done_s']:.2f} s cpu {r['cpu_s']:.2f} s "
                        f"mem {r.get('peak_rss_mb', 0):.0f} MB node cpu/node "
                        f"{r.get('node_cpu_med', 0):.2f} s trips {rt.get('max')} ok={r['ok']}"
                        + (f" connections {rl.get('connections')} exchanges "
                           f"{rl.get('exchanges')} relay cpu {rl.get('relay_cpu_s')}"
                           if relay else ""))
                    if r.get("killed_low_mem"):
                        log("memory ran low: the launch was killed, the size ends here")
                        stopped = True
                        break
                if stopped:
                    break
            if stopped:
                break
            if view == views[0] and not stopped:
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
        if relays:
            delay.kill_masters(next(iter(relays.values()))["cp_base"])
        t_down = time.monotonic()
        testbed.down(name)
        down_s = time.monotonic() - t_down
    out = {"nodes": n, "runs": results, "watch": watch_res, "idle_node_cpu": idle_by_view,
           "up_s": up_s, "down_s": down_s, "mem_available_min_gib": mem_low,
           "stopped_low_mem": stopped}
    if relays:
        out.update(delays=sorted(relays), warmup=warmup)
    return out


def med(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def peak_mb(r: dict) -> float | None:
    """The launch's peak memory; for a and b without the ssh multiplexers that a torchherd
    launch before them left alive (they use none; runs before that fix counted them)."""
    if r.get("peak_rss_mb") is None:
        return None
    if r["method"] in "ab":
        return r["peak_rss_mb"] - (r.get("peak_parts") or {}).get("ssh mux", [0, 0.0])[1]
    return r["peak_rss_mb"]


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
                          "peak_rss_mb": med([peak_mb(r) for r in runs]),
                          "node_cpu_med": med([r.get("node_cpu_med") for r in runs]),
                          "node_mem_mb": med([r.get("node_mem_peak_mb") for r in runs]),
                          "trips": max((r["round_trips"]["max"] for r in runs
                                        if r.get("round_trips")), default=None),
                          "trips_total": max((r["round_trips"].get("total_max", 0)
                                              for r in runs if r.get("round_trips")),
                                             default=None),
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


TARGETS = {  # at 8 nodes, relaunch d (c for the controller's full-launch figure)
    "own_node_cpu": 0.5, "ctrl_per_node_d": 0.3, "ctrl_per_node_c": 0.5, "trips": 2,
    "watch_per_node_hour": 1.0}


def _met(value: float | None, target: float) -> str:
    if value is None:
        return "not measured"
    return "met" if value <= target else "**not met**"


def cost_sections(info: dict, rows: list[dict], sizes: list[dict]) -> list[str]:
    """The per-node cost of a launch: tables, round trips, targets, the model and its check."""
    lines = ["", "## What a launch costs per node", "",
             "Per view and size, medians over the repetitions. *ctrl CPU*: the controller's "
             "CPU-seconds of the launching process tree, ssh multiplexers included, per node; "
             "*serial*: of that, the driver's and ansible-playbook's main process (one core "
             "whatever the controller has). *peak mem*: the peak over the launch of the sum of "
             "RSS of the launching process tree and the ssh multiplexers, sampled every 50 ms "
             "from /proc (RSS counts the pages Ansible's forked workers share with their "
             "parent once per worker: an upper bound). *node CPU*: each node container's own "
             "CPU accounting (cgroup cpuacct) over the launch, less the idle node's rate times "
             "the launch's length, median over the nodes; *torchherd on node*: that less what "
             "the same node used for the same job under pdsh (b) in the same view, per node "
             "(median and max over the nodes). *node peak mem*: the container's peak memory "
             "over the launch (cgroup memory.max_usage_in_bytes, page cache included), median "
             "over the nodes. *trips*: tasks that ran on a node up to and "
             "including the start (whole launch in brackets).", "",
             "| view | nodes | method | reps | init (s) | done (s) | ctrl CPU/node (s) "
             "| serial (s) | peak mem (MB) | mem/node (MB) | node CPU/node (s) "
             "| torchherd on node (s) | node peak mem (MB) | trips |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for m in "bcd":
            r = row[m]
            if not r["n"]:
                continue
            own = (f"{fmt(r.get('own_node_cpu'))} / {fmt(r.get('own_node_cpu_max'))}"
                   if "own_node_cpu" in r else "-")
            lines.append(
                f"| {row['view']} | {row['nodes']} | {m} | {r['n']} | {fmt(r['init_s'], '.1f')} "
                f"| {fmt(r['done_s'], '.1f')} | {fmt(r.get('cpu_per_node'), '.3f')} "
                f"| {fmt(r.get('serial_cpu') if m != 'b' else None)} "
                f"| {fmt(r.get('peak_rss_mb'), '.0f')} | {fmt(r.get('rss_per_node_mb'), '.1f')} "
                f"| {fmt(r.get('node_cpu_med'))} | {own} | {fmt(r.get('node_mem_mb'), '.0f')} "
                f"| {r.get('trips') or '-'} ({r.get('trips_total') or '-'}) |")
    failed = [r for sz in sizes for r in sz["runs"] if not r["ok"]]
    if failed:
        lines += ["", "Runs that failed (left out of every median above and of the model; their "
                  "launch went through plan, facts, start, watch and collect all the same):", "",
                  "| view | nodes | method | rep | done (s) | ctrl CPU/node (s) | peak mem (MB) "
                  "| node CPU/node (s) | trips | what |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in failed:
            n = r.get("nodes") or 1
            lines.append(f"| {r.get('view', 'shared')} | {n} | {r['method']} | {r.get('rep')} "
                         f"| {fmt(r.get('done_s'), '.1f')} | {fmt(r.get('cpu_s', 0) / n, '.3f')} "
                         f"| {fmt(r.get('peak_rss_mb'), '.0f')} | {fmt(r.get('node_cpu_med'))} "
                         f"| {(r.get('round_trips') or {}).get('max', '-')} "
                         f"| {r.get('error') or r.get('failure') or 'the job failed'} |")
    # round trips: the task list of d and c at the smallest size >= 8 (or any)
    pick = [s for s in sizes if s["nodes"] >= 8] or sizes
    for m in "dc":
        runs = [r for s in pick for r in s["runs"] if r["method"] == m and r["ok"]
                and r.get("round_trips", {}).get("tasks")]
        if not runs:
            continue
        rt = runs[0]["round_trips"]
        lines += ["", f"### Round trips before the job starts: {METHODS[m]} "
                  f"({runs[0]['nodes']} nodes, {runs[0].get('view', 'shared')})", "",
                  f"{rt['max']} per node (min {rt['min']} over the nodes; the whole launch "
                  f"{rt.get('total_max', '-')}), against pdsh's 1. Counted from the child's "
                  "ansible-runner events: per node, the ok/failed/unreachable results of tasks "
                  "that are not controller-only actions (set_fact, assert, debug, run_record, "
                  "...) and not delegated, up to the first result of "
                  f"`{cost.START_ACTION}` from `{cost.START_FILE}` (the start, included). "
                  f"Besides, {rt['skipped_per_node']} tasks were skipped per node before the "
                  "start (Ansible forks a worker per node to find that out, no round trip) and "
                  f"{rt['local_per_node']} ran on the controller under a node's name.", "",
                  "| task | action | file | on the node | results |", "|---|---|---|---|---|"]
        for t in rt["tasks"]:
            where = (t["file"] or "").split("/cluster/")[-1]
            lines.append(f"| {t['task']} | {t['action']} | {where} | "
                         f"{'yes' if t['remote'] else 'no'} | {t['hosts']} |")
    # targets
    row8 = next((r for r in rows if r["nodes"] == 8 and r["view"] == "shared"), None)
    watch = [w for s in sizes for w in s.get("watch") or [] if not w.get("arm")]
    if row8:
        d, c = row8["d"], row8["c"]
        wv = watch[0]["cpu_per_node_hour"] if watch else None
        lines += ["", "## Targets (8 nodes, shared view, relaunch d with unchanged code)", "",
                  "| what | target | measured | |", "|---|---|---|---|",
                  f"| torchherd's own node CPU per node (d) | <= {TARGETS['own_node_cpu']} CPU-s "
                  f"| {fmt(d.get('own_node_cpu'))} (max {fmt(d.get('own_node_cpu_max'))}) "
                  f"| {_met(d.get('own_node_cpu'), TARGETS['own_node_cpu'])} |",
                  f"| controller CPU per node, relaunch d | <= {TARGETS['ctrl_per_node_d']} CPU-s "
                  f"| {fmt(d.get('cpu_per_node'), '.3f')} "
                  f"| {_met(d.get('cpu_per_node'), TARGETS['ctrl_per_node_d'])} |",
                  f"| controller CPU per node, launch c | <= {TARGETS['ctrl_per_node_c']} CPU-s "
                  f"| {fmt(c.get('cpu_per_node'), '.3f')} "
                  f"| {_met(c.get('cpu_per_node'), TARGETS['ctrl_per_node_c'])} |",
                  f"| round trips before the job starts (d) | <= {TARGETS['trips']} "
                  f"| {d.get('trips') or '-'} | {_met(d.get('trips'), TARGETS['trips'])} |",
                  f"| watching, CPU-s per node per hour | <= {TARGETS['watch_per_node_hour']} "
                  f"| {fmt(wv)} | {_met(wv, TARGETS['watch_per_node_hour'])} |"]
        sep8 = next((r for r in rows if r["nodes"] == 8 and r["view"] == "separate"), None)
        if sep8:
            lines += ["", "Separate cores at 8 nodes: torchherd's own node CPU "
                      f"{fmt(sep8['d'].get('own_node_cpu'))} CPU-s per node, controller "
                      f"{fmt(sep8['d'].get('cpu_per_node'), '.3f')} (d) and "
                      f"{fmt(sep8['c'].get('cpu_per_node'), '.3f')} (c) CPU-s per node."]
    # the model
    mod = cost.model(rows, "d", cores=info["nproc"], fit_to=FIT_TO)
    if mod:
        modc = cost.model(rows, "c", cores=info["nproc"], fit_to=FIT_TO)
        (s0, s1), (p0, p1), (o0, _) = mod["serial"], mod["parallel"], mod["own_node"]
        (a, b), (m0, m1) = mod["ctrl"], mod["mem"]
        lines += [
            "", "## A model of the launch overhead", "",
            f"Fitted by least squares over the shared view's sizes {mod['sizes']}, relaunch d "
            "(code unchanged):", "",
            f"- controller CPU C(N) = {a:.2f} + {b:.3f} N CPU-s, of which serial (the driver "
            f"and ansible-playbook's main process) S(N) = {s0:.2f} + {s1:.3f} N and the rest "
            f"(forked workers, ssh clients, multiplexers) P(N) = {p0:.2f} + {p1:.3f} N;",
            f"- torchherd's own CPU on each node o = {o0:.2f} CPU-s (node CPU of d less "
            "pdsh's, per node; the median over the sizes: "
            + ", ".join(f"{y:.2f} at {x}" for x, y in mod["own_node_points"])
            + (f"; for c {modc['own_node'][0]:.2f}" if modc else "") + ");",
            f"- peak controller memory M(N) = {m0:.0f} + {m1:.1f} N MB (RSS sum);",
            f"- {mod['trips']} round trips per node before the job starts, "
            f"{mod['trips_total']} in the whole launch (pdsh: 1);",
            f"- a fixed wait W = {mod['wait_s']:.1f} s: the extra wall time at "
            f"{cost.CALIBRATE} nodes (chain-bound here) that the CPU terms below do not "
            "explain (median of the views: "
            + ", ".join(f"{w:.1f}" for w in mod["wait_points"]) + " s): time the launch "
            "waits without using CPU, on a node or the controller (interpreter and ssh "
            "start-up off-CPU, I/O, the modules' 0.1-0.25 s polls, the job's end reaching "
            "the watch).", "",
            "On a real cluster the nodes work in parallel on their own CPUs: torchherd's node "
            "CPU is paid once, not N times. The controller's serial part runs on one core, "
            "the rest spreads over its K cores. Each round trip beyond pdsh's one adds a "
            f"latency L = {cost.RTTS_PER_TASK} x {cost.RTT_S * 1000:.0f} ms (a LAN round trip "
            "per session open, module send, result over the open ssh multiplexer) + "
            f"{cost.POLL_S * 1000:.0f} ms (ansible.cfg's internal_poll_interval: the strategy "
            f"loop notices a result at its next look) = {cost.LATENCY_S * 1000:.0f} ms; their "
            "CPU is in C and o already. The overhead of a blocking launch over pdsh is then",
            "", "    T(N, K) = S(N) + P(N) / K + o(N) + (R_total - 1) L + W", "",
            "(the issue's simpler form, every controller CPU-second but the fixed start-up "
            "spread over K cores: T' = C(0) + (C(N) - C(0)) / K + o(N) + (R_total - 1) L + W; "
            "it leaves out that ansible-playbook's main process handles every node's result "
            "on one core).", "",
            "### The model against this machine", "",
            "The same terms, measured at each size, predict the extra wall time over pdsh "
            "here as the larger of two bounds. *chain*: T(N, K) itself with this machine's "
            f"K ({info['nproc']} cores shared; 1 for the controller in the separate view), "
            f"L = {cost.LOCAL_LATENCY_S * 1000:.0f} ms (the poll interval; a veth round trip "
            f"is free) and W (so at {cost.CALIBRATE} nodes it matches by construction). "
            "*work*: here the nodes are no help, every extra CPU-second (controller: "
            "the method less pdsh; nodes: N x torchherd's own) needs one of the machine's "
            "cores: in the shared view their sum over the cores; in the separate view (the "
            "controller on CPU 0, all nodes on CPU 1) between the larger of the two "
            "(overlapped) and their sum (not). Small clusters are chain-bound, large ones "
            "work-bound. Measured: the extra wall time over pdsh to done (to init in "
            "brackets).", "",
            "| view | nodes | method | extra ctrl CPU (s) | extra node CPU (s) | bound "
            "| predicted (s) | measured done (init) (s) |", "|---|---|---|---|---|---|---|---|"]
        for row in rows:
            for m in "cd":
                mm = mod if m == "d" else modc
                chk = cost.check_here(row, m, info["nproc"], max(mm["wait_s"], 0.0) if mm else 0)
                if not chk:
                    continue
                pred = (fmt(chk["pred_low"], ".1f") if chk["pred_low"] == chk["pred_high"]
                        else f"{chk['pred_low']:.1f}-{chk['pred_high']:.1f}")
                lines.append(f"| {row['view']} | {row['nodes']} | {m} | {chk['ctrl_extra']:.1f} "
                             f"| {chk['node_extra']:.1f} | {chk['bound']} | {pred} "
                             f"| {chk['measured_done']:.1f} ({fmt(chk['measured_init'], '.1f')}) |")
        lines += ["", "### Predictions for a real cluster", "",
                  "| nodes | controller cores | method | serial S (s) | P/K (s) | node o (s) "
                  "| trips (s) | W (s) | T (s) | T' (s) | controller CPU (s) | peak mem (GB) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for mm in (mod, modc):
            if not mm:
                continue
            for n, k in ((8, 8), (64, 8), (256, 8), (256, 32)):
                pr = cost.predict(mm, n, k)
                lines.append(f"| {n} | {k} | {mm['method']} | {pr['serial_s']:.1f} "
                             f"| {pr['parallel_s']:.1f} | {pr['node_s']:.2f} "
                             f"| {pr['trips_s']:.2f} | {pr['wait_s']:.1f} "
                             f"| **{pr['total_s']:.1f}** "
                             f"| {pr['simple_s']:.1f} | {pr['ctrl_cpu_s']:.0f} "
                             f"| {pr['mem_mb'] / 1024:.1f} |")
    # what the runs cost
    lines += ["", "## What the runs cost this machine", "",
              "| nodes | views | bring-up (s) | teardown (s) | least free memory (GiB) "
              "| sampler CPU per launch (s) | idle node CPU (CPU-s/s) |",
              "|---|---|---|---|---|---|---|"]
    for s in sizes:
        sampler = med([r.get("sampler_cpu_s") for r in s["runs"]])
        idle = "/".join(f"{v:.4f}" for v in (s.get("idle_node_cpu") or {}).values())
        views = ", ".join(dict.fromkeys(r.get("view", "shared") for r in s["runs"]))
        lines.append(f"| {s['nodes']} | {views} | {fmt(s.get('up_s'), '.0f')} "
                     f"| {fmt(s.get('down_s'), '.0f')} "
                     f"| {fmt(s.get('mem_available_min_gib'), '.1f')} | {fmt(sampler)} "
                     f"| {idle or '-'} |")
    return lines


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
        "(code unchanged). CPU = controller CPU-seconds of the launching process tree. "
        "View shared: the controller and the nodes on all CPUs; separate (--separate-cores): "
        "the controller (this script and all it starts, the ssh multiplexers too) on CPU 0, "
        "every node container on CPU 1 (cgroup cpuset). Code: commit "
        f"{info.get('commit') or '-'}, collection of that commit.",
        "",
        "| view | nodes | reps | init a/b/c/d | done a | done b | done c | done d | c/b | d/b "
        "| c-b (s) | d-b (s) | CPU/node b | CPU/node c | CPU/node d |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        b = row["b"]["done_s"]
        c, d = row["c"]["done_s"], row["d"]["done_s"]
        inits = "/".join(fmt(row[m]["init_s"], ".1f") for m in METHODS)
        lines.append(
            f"| {row['view']} | {row['nodes']} | {row['c']['n']} | {inits} "
            f"| {fmt(row['a']['done_s'])} "
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
    lines += cost_sections(info, rows, sizes)
    prof = [s for s in sizes if any(r["method"] == "c" and r["ok"] for r in s["runs"])]
    if prof:
        s = next((x for x in prof if x["nodes"] == 8), prof[-1])
        for m in "cd":
            runs = [r for r in s["runs"] if r["method"] == m and r["ok"]
                    and r.get("view", "shared") == "shared"]
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

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    (ax1, ax2), (ax3, ax4) = axes
    colors = {"a": "C0", "b": "C1", "c": "C2", "d": "C3"}
    allx = sorted({r["nodes"] for r in rows})
    for view, style in (("shared", "-"), ("separate", "--")):
        vrows = [r for r in rows if r["view"] == view]
        if not vrows:
            continue
        xs = [r["nodes"] for r in vrows]
        for m, label in METHODS.items():
            if not any(r[m]["n"] for r in vrows):
                continue
            kw = {"marker": "o", "ls": style, "color": colors[m],
                  "label": f"{m}: {label} ({view})"}
            ax1.plot(xs, [r[m]["done_s"] for r in vrows], **kw)
            ax2.plot(xs, [r[m].get("cpu_per_node") for r in vrows], **kw)
            ax4.plot(xs, [r[m].get("rss_per_node_mb") for r in vrows], **kw)
            if m != "b":
                ax3.plot(xs, [r[m].get("own_node_cpu") for r in vrows], **kw)
    ax1.set(xlabel="nodes", ylabel="seconds to done (median)", title="Launch to done")
    ax2.set(xlabel="nodes", ylabel="controller CPU-s per node",
            title="Controller CPU per node (ssh multiplexers included)")
    ax2.axhline(0.3, color="grey", ls=":", lw=0.8)
    ax2.axhline(0.5, color="grey", ls="--", lw=0.8)
    ax3.set(xlabel="nodes", ylabel="CPU-s per node (method less pdsh)",
            title="torchherd's own CPU on each node")
    ax3.axhline(0.5, color="grey", ls="--", lw=0.8)
    ax4.set(xlabel="nodes", ylabel="MB per node (peak RSS sum / nodes)",
            title="Controller peak memory per node")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(allx, [str(x) for x in allx])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7)
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


def delay_docs(args: argparse.Namespace) -> int:
    """--from with results of --delay-ms runs: their sizes together into the docs."""
    infos, chosen = [], []
    for item in args.from_json.split(","):
        path, _sep, only = item.partition("#")
        data = json.loads(Path(path).read_text())
        wanted = {int(x) for x in only.split("+")} if only else None
        picked = [sz for sz in data["sizes"] if wanted is None or sz["nodes"] in wanted]
        chosen += picked
        infos.append(dict(data["machine"], sizes=",".join(str(sz["nodes"]) for sz in picked),
                          file=Path(path).name))
    # Runs of one size from several files: their repetitions together.
    merged: dict[int, dict] = {}
    for sz in chosen:
        into = merged.setdefault(sz["nodes"], {**sz, "runs": [], "delays": [], "warmups": []})
        offset = 1 + max((r.get("rep", 0) for r in into["runs"]), default=-1)
        into["runs"] += [dict(r, rep=r.get("rep", 0) + offset) for r in sz["runs"]]
        into["delays"] = sorted(set(into["delays"]) | set(sz.get("delays") or []))
        into["warmups"].append(sz.get("warmup"))
    chosen = [merged[n] for n in sorted(merged)]
    rows = delay.summarize(chosen)
    command = args.command or infos[0].get("command", "")
    delay.write_markdown(ROOT / "docs" / "benchmark.md", infos, rows, chosen, args.note,
                         command)
    delay.write_plot(ROOT / "docs" / "benchmark.png", rows)
    print(json.dumps(rows, indent=1))
    return 0


# The largest size the docs' model is fitted on (--fit-to).
FIT_TO = 1 << 30


def main() -> int:
    global FIT_TO
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
    p.add_argument("--alt-container", action="store_true",
                   help="e and f run the job in the testbed's job image (nodes that run podman); "
                        "c and d on the same nodes without it")
    p.add_argument("--alt-venv", action="store_true",
                   help="e and f run the job in a locked venv (a one-package lock from a "
                        "wheelhouse on the nodes, the nodes' torch beneath it); c and d without")
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
                   help="only write the docs from earlier bench/results/*.json "
                        "(comma-separated: their sizes together; FILE#8+16 takes those sizes "
                        "of FILE only)")
    p.add_argument("--fit-to", type=int, default=FIT_TO,
                   help="fit the docs' model on sizes up to this many nodes only")
    p.add_argument("--watch-from", metavar="RESULTS",
                   help="with --from: the watch measurement of this results file instead")
    p.add_argument("--delay-ms", metavar="RTT,...",
                   help="round-trip times in ms (e.g. 1,20): every SSH connection of every "
                        "method goes through bench/delay_relay.py, which adds that round trip; "
                        "each repetition runs every delay; methods default to bgd (g: a relaunch "
                        "that opens new SSH connections, d: one that reuses those of the "
                        "launch before it), no watch; torchherd without the checkout's "
                        "ansible.cfg (as a user with none)")
    p.add_argument("--command", default="",
                   help="with --from: the command line that docs/benchmark.md names")
    args = p.parse_args()
    FIT_TO = args.fit_to
    if args.from_json and any("delays" in sz for item in args.from_json.split(",")
                              for sz in json.loads(Path(item.partition("#")[0]).read_text())
                              ["sizes"]):
        return delay_docs(args)
    if args.from_json:
        files, chosen = [], []
        for item in args.from_json.split(","):
            path, _sep, only = item.partition("#")
            files.append(json.loads(Path(path).read_text()))
            wanted = {int(x) for x in only.split("+")} if only else None
            chosen += [sz for sz in files[-1]["sizes"] if wanted is None or sz["nodes"] in wanted]
        if args.watch_from:
            watches = [w for sz in json.loads(Path(args.watch_from).read_text())["sizes"]
                       for w in sz.get("watch") or []]
            chosen = [dict(sz, watch=[w for w in watches if w["nodes"] == sz["nodes"]])
                      for sz in chosen]
        saved = {"machine": files[-1]["machine"],
                 "sizes": sorted(chosen, key=lambda sz: sz["nodes"])}
        rows = summarize(saved["sizes"])
        write_markdown(ROOT / "docs" / "benchmark.md", saved["machine"], rows, saved["sizes"],
                       args.note)
        write_plot(ROOT / "docs" / "benchmark.png", rows)
        print(json.dumps(rows, indent=1))
        return 0
    extra_env = dict(kv.split("=", 1) for kv in args.env)
    alt_env = dict(kv.split("=", 1) for kv in args.alt_env)
    alt_job = {"container": {"image": testbed.job_images()[1], "pull": "never"}} \
        if args.alt_container else None
    if args.alt_venv:
        alt_job = {"venv": {"lock": "requirements.lock", "find_links": [VENV_WHEELS],
                            "system_site_packages": True}}
    delays = sorted({float(x) for x in args.delay_ms.split(",")}) if args.delay_ms else []
    if delays and "--methods" not in " ".join(sys.argv):
        args.methods = "bgd"
    if delays and "--watch-nodes" not in " ".join(sys.argv):
        args.watch_nodes = 0
    if not shutil.which("pdsh") and "b" in args.methods:
        raise SystemExit("pdsh not found: apt-get install -y pdsh")
    info = machine()
    info.update(command=shlex.join([".venv/bin/python", "bench/run.py", *sys.argv[1:]]),
                sizes=args.sizes)
    if delays:
        from driver import runner
        info["own_ssh_args"] = getattr(runner, "OWN_SSH_ARGS", None)
    log(f"machine: {info}")
    work = Path(tempfile.mkdtemp(prefix="thbench-"))
    (work / "code").mkdir()
    shutil.copy(ROOT / "examples" / "allreduce.py", work / "code" / "allreduce.py")
    if args.alt_venv:
        (work / "code" / "requirements.lock").write_text("thbench==1.0\n")
        pure_wheel(work / "wheels", "thbench", "1.0", "one")
        shutil.copy(uv_wheel(), work / "wheels")
    CP_DIR.mkdir(exist_ok=True)
    relays = None
    if delays:
        relays = delay.setup(work, delays)
        cp_base = CP_DIR / f"delay-{os.getpid()}"
        for relay in relays.values():
            relay["cp_base"] = cp_base
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
                                  views, args.min_mem_gib, alt_job,
                                  {d: dict(r) for d, r in relays.items()} if relays else None))
        (out_dir / f"{stamp}{args.tag}.json").write_text(
            json.dumps({"machine": info, "env": extra_env, "alt_env": alt_env,
                        "alt_job": alt_job, "sizes": sizes}, indent=1, default=str))
    if relays:
        shutil.rmtree(relays[delays[0]]["cp_base"], ignore_errors=True)
        rows = delay.summarize(sizes)
        if not args.tag:
            delay.write_markdown(ROOT / "docs" / "benchmark.md", [info], rows, sizes,
                                 args.note, info["command"])
            delay.write_plot(ROOT / "docs" / "benchmark.png", rows)
        print(json.dumps(rows, indent=1))
        shutil.rmtree(work, ignore_errors=True)
        return 0
    rows = summarize(sizes)
    if not args.tag:
        write_markdown(ROOT / "docs" / "benchmark.md", info, rows, sizes, args.note)
        write_plot(ROOT / "docs" / "benchmark.png", rows)
    print(json.dumps(rows, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
