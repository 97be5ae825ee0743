"""What a launch costs per node: the probes bench/run.py adds around every launch.

- TreeSampler: the controller's peak memory (sum of RSS over the launching process tree and
  the ssh ControlPersist masters, sampled every 50 ms from /proc) and which process did the
  CPU work (the serial driver and ansible-playbook main process against the rest);
- node_cpu: each node container's own CPU accounting (cgroup cpuacct.usage, v1, or
  cpu.stat usage_usec, v2);
- set_view: the controller on CPU 0 and the nodes on CPU 1 (--separate-cores), or shared;
- round_trips: from the ansible-runner events the child driver records, the tasks that ran
  on a node before the start task, per node;
- model: the launch overhead on a real cluster from those figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")
CGROUP = Path("/sys/fs/cgroup")

# --------------------------------------------------------------------------------------------
# controller: peak memory of the launch's processes, and who spent the CPU


def _read_stat(pid: int) -> tuple[str, int, float, int, int] | None:
    """(comm, ppid, own utime+stime s, rss bytes, starttime) of a live process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            raw = handle.read().decode(errors="replace")
    except OSError:
        return None
    comm = raw[raw.index("(") + 1:raw.rindex(")")]
    f = raw[raw.rindex(")") + 2:].split()
    # fields after comm: 0 state, 1 ppid, 11 utime, 12 stime, 19 starttime, 21 rss
    return comm, int(f[1]), (int(f[11]) + int(f[12])) / TICK, int(f[21]) * PAGE, int(f[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


class TreeSampler(threading.Thread):
    """Every `interval` s: the RSS of every live descendant of `root` (not `root` itself when
    `exclude_root`) plus every ssh multiplexer whose command line names `mux_dir` (none when
    it is empty); the peak of
    the sum, with its make-up by command, and each process's last seen own CPU time.

    New pids are read as they appear; the ones found foreign are not read again, except in a
    full pass every `full_every` samples (a reused pid)."""

    def __init__(self, root: int, mux_dir: str, interval: float = 0.05, full_every: int = 20,
                 exclude_root: bool = True, kill_below_gib: float = 0.6) -> None:
        super().__init__(daemon=True)
        self.root, self.mux_dir, self.interval = root, mux_dir, interval
        self.full_every, self.exclude_root = full_every, exclude_root
        self.stop_event = threading.Event()
        self.ours: dict[tuple[int, int], str] = {}  # (pid, starttime) -> "tree" | "mux"
        self.foreign: set[int] = set()
        self.last: dict[tuple[int, int], tuple[str, int, float]] = {}  # -> comm, ppid, own cpu
        self.peak = 0
        self.peak_at = 0.0
        self.peak_parts: dict[str, list] = {}
        self.samples = 0
        self.cpu_self = 0.0
        # Below kill_below_gib of free memory the launch's own processes are killed (by pid):
        # the machine is shared, and a node OOM would hit other people's containers too.
        self.kill_below_gib, self.mem_min_gib, self.killed = kill_below_gib, float("inf"), False
        self.t0 = time.monotonic()

    def _classify(self, pid: int, st: tuple, tree_pids: set[int]) -> str | None:
        comm, ppid = st[0], st[1]
        if pid == self.root:
            return "root"
        if ppid in tree_pids:
            return "tree"
        if self.mux_dir and comm == "ssh" and self.mux_dir in _cmdline(pid) \
                and "[mux]" in _cmdline(pid):
            return "mux"
        return None

    def sample(self, full: bool) -> None:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
        if full:
            self.foreign.clear()
        stats = {}
        for pid in pids:
            if pid in self.foreign:
                continue
            st = _read_stat(pid)
            if st:
                stats[pid] = st
        # the tree: parents before children is not guaranteed by pid order (wrap), so iterate
        tree_pids = {self.root}
        kinds: dict[int, str] = {}
        changed = True
        while changed:
            changed = False
            for pid, st in stats.items():
                if pid in kinds:
                    continue
                known = self.ours.get((pid, st[4]))
                kind = known or self._classify(pid, st, tree_pids)
                if kind:
                    kinds[pid] = kind
                    if kind in ("tree", "root"):
                        tree_pids.add(pid)
                    changed = True
        total, parts = 0, {}
        for pid, st in stats.items():
            kind = kinds.get(pid)
            if kind is None:
                self.foreign.add(pid)
                continue
            if kind != "root":
                self.ours[(pid, st[4])] = kind
            if kind == "root" and self.exclude_root:
                continue
            self.last[(pid, st[4])] = (st[0], st[1], st[2])
            total += st[3]
            name = "ssh mux" if kind == "mux" else st[0]
            part = parts.setdefault(name, [0, 0])
            part[0] += 1
            part[1] += st[3]
        self.samples += 1
        free = mem_available_gib()
        self.mem_min_gib = min(self.mem_min_gib, free)
        if free < self.kill_below_gib and not self.killed:
            self.killed = True
            for pid, kind in kinds.items():
                if kind == "tree":
                    with contextlib.suppress(OSError):
                        os.kill(pid, 9)
        if total > self.peak:
            self.peak, self.peak_parts = total, parts
            self.peak_at = time.monotonic() - self.t0

    def run(self) -> None:
        c0 = time.thread_time()
        i = 0
        while not self.stop_event.is_set():
            self.sample(full=i % self.full_every == 0)
            i += 1
            self.stop_event.wait(self.interval)
        self.sample(full=True)
        self.cpu_self = time.thread_time() - c0

    def result(self) -> dict:
        self.stop_event.set()
        self.join()
        # Serial work: the driver (the child's own Python) and ansible-playbook's main process
        # (the one whose parent is not ansible-playbook: the others are its forked workers).
        comm_of = {pid: comm for (pid, _), (comm, _, _) in self.last.items()}
        serial = {}
        for (_pid, _), (comm, ppid, cpu) in self.last.items():
            if ppid == self.root and comm.startswith("python"):
                serial["driver"] = serial.get("driver", 0.0) + cpu
            elif comm.startswith("ansible-playboo") and \
                    not comm_of.get(ppid, "").startswith("ansible-playboo"):
                serial["ansible_main"] = serial.get("ansible_main", 0.0) + cpu
        return {"peak_rss_mb": self.peak / 2**20, "peak_at_s": round(self.peak_at, 2),
                "peak_parts": {k: [v[0], round(v[1] / 2**20, 1)]
                               for k, v in sorted(self.peak_parts.items(),
                                                  key=lambda kv: -kv[1][1])},
                "samples": self.samples, "sampler_cpu_s": round(self.cpu_self, 3),
                "mem_available_min_gib": round(self.mem_min_gib, 2), "killed_low_mem": self.killed,
                "serial_cpu": {k: round(v, 3) for k, v in serial.items()}}


# --------------------------------------------------------------------------------------------
# nodes: the containers' own CPU accounting, and the cores they may use


def container_cgroups(names: list[str]) -> dict[str, str]:
    out = subprocess.run(["podman", "inspect", "--format", "{{.Name}} {{.State.CgroupPath}}",
                          *names], capture_output=True, text=True, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if line.strip())


def _usage_file(path: str) -> Path:
    v1 = CGROUP / "cpuacct" / path.lstrip("/") / "cpuacct.usage"
    return v1 if v1.exists() else CGROUP / path.lstrip("/") / "cpu.stat"


def node_cpu(paths: dict[str, str]) -> dict[str, float]:
    """CPU-seconds each container has used since it started (its cgroup and all below)."""
    out = {}
    for name, path in paths.items():
        f = _usage_file(path)
        text = f.read_text()
        if f.name == "cpuacct.usage":
            out[name] = int(text) / 1e9
        else:
            usec = next(int(line.split()[1]) for line in text.splitlines()
                        if line.startswith("usage_usec"))
            out[name] = usec / 1e6
    return out


def node_mem_reset(paths: dict[str, str]) -> None:
    """cgroup v1: restart each container's peak memory (memory.max_usage_in_bytes)."""
    for path in paths.values():
        f = CGROUP / "memory" / path.lstrip("/") / "memory.max_usage_in_bytes"
        with contextlib.suppress(OSError):
            f.write_text("0")


def node_mem_peak(paths: dict[str, str]) -> dict[str, float]:
    """MB: each container's peak memory since the reset (page cache included), v1 only."""
    out = {}
    for name, path in paths.items():
        f = CGROUP / "memory" / path.lstrip("/") / "memory.max_usage_in_bytes"
        with contextlib.suppress(OSError, ValueError):
            out[name] = int(f.read_text()) / 2**20
    return out


def mem_available_gib() -> float:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    return float("inf")


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in before}


def _set_cpuset(path: str, cpus: str, shrink: bool) -> None:
    """cgroup v1: write cpuset.cpus on the container's cgroup and every cgroup below it; the
    children first when shrinking (a parent may not drop a CPU a child still holds), last
    when growing."""
    top = CGROUP / "cpuset" / path.lstrip("/")
    dirs = [top, *[Path(d) for d, _, _ in os.walk(top) if Path(d) != top]]
    for d in (reversed(dirs) if shrink else dirs):
        (d / "cpuset.cpus").write_text(cpus)


def set_view(view: str, names: list[str], paths: dict[str, str], mux_pids: list[int]) -> None:
    """separate: this process (its threads and the children it starts later) and the live ssh
    multiplexers on CPU 0, the node containers on CPU 1; shared: all on every CPU."""
    all_cpus = set(range(os.cpu_count() or 1))
    ctrl = {0} if view == "separate" else all_cpus
    nodes = "1" if view == "separate" else f"0-{max(all_cpus)}"
    for tid in [int(t) for t in os.listdir("/proc/self/task")] + mux_pids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, ctrl)
    if (CGROUP / "cpuset").is_dir():
        for name in names:
            _set_cpuset(paths[name], nodes, shrink=view == "separate")
    else:
        subprocess.run(["podman", "update", "--cpuset-cpus", nodes, *names], check=True,
                       capture_output=True)


# --------------------------------------------------------------------------------------------
# round trips before the job starts, from the child driver's ansible-runner events

START_ACTION = "torchherd.cluster.torchrun_job"
START_FILE = "roles/torchrun/tasks/start.yml"
# Actions that run on the controller only, whatever host they name.
LOCAL_ACTIONS = {
    "set_fact", "assert", "debug", "fail", "meta", "add_host", "group_by", "set_stats",
    "include_vars", "include_tasks", "import_tasks", "include_role", "import_role",
    "validate_argument_spec", "pause", "run_summary", "run_record",
}
RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable")


def _short(action: str) -> str:
    return action.rsplit(".", 1)[-1]


def is_start(ev: dict) -> bool:
    return _short(ev.get("action") or "") == _short(START_ACTION) and \
        START_FILE in (ev.get("path") or "")


def round_trips(events: Path, hosts: list[str]) -> dict:
    """Per node: the tasks that ran on it (ok, failed or unreachable; not skipped, not run on
    the controller alone or delegated there) up to and including the start task. The start is
    the first result of torchrun_job from roles/torchrun/tasks/start.yml."""
    counted: dict[str, list[str]] = {h: [] for h in hosts}
    total: dict[str, int] = dict.fromkeys(hosts, 0)  # the whole launch, collect included
    skipped: dict[str, int] = dict.fromkeys(hosts, 0)
    local: dict[str, int] = dict.fromkeys(hosts, 0)
    started: set[str] = set()
    tasks: dict[str, dict] = {}
    for line in events.read_text().splitlines():
        ev = json.loads(line)
        host = ev.get("host")
        if host not in counted:
            continue
        remote = not ev.get("delegated") and _short(ev.get("action") or "") not in LOCAL_ACTIONS
        if ev["event"] in RESULT_EVENTS and remote:
            total[host] += 1
        if host in started:
            continue
        key = f"{ev.get('name')} [{_short(ev.get('action') or '')}]"
        if ev["event"] == "runner_on_skipped":
            skipped[host] += 1
            continue
        if ev["event"] not in RESULT_EVENTS:
            continue
        info = tasks.setdefault(key, {"task": ev.get("name"), "action": ev.get("action"),
                                      "file": ev.get("path"), "remote": remote, "hosts": 0})
        info["hosts"] += 1
        if remote:
            counted[host].append(key)
        else:
            local[host] += 1
        if is_start(ev):
            started.add(host)
    per_node = {h: len(v) for h, v in counted.items()}
    return {"per_node": per_node, "max": max(per_node.values(), default=0),
            "min": min(per_node.values(), default=0), "all_started": started == set(hosts),
            "total_max": max(total.values(), default=0),
            "skipped_per_node": max(skipped.values(), default=0),
            "local_per_node": max(local.values(), default=0), "tasks": list(tasks.values())}


# --------------------------------------------------------------------------------------------
# the model


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    if len(xs) < 2:
        return (ys[0] if ys else 0.0), 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - b * mx, b


# Latency of one round trip on a real cluster, beyond the CPU the model counts already: a LAN
# round trip of 1 ms, three of them per task over an open ssh multiplexer (open a session,
# send the module, get the result), and the strategy loop noticing the result, on average
# half of ansible.cfg's internal_poll_interval (0.02 s) after it arrived, plus the next task's
# queueing: one whole interval, to be safe.
RTT_S = 0.001
RTTS_PER_TASK = 3
POLL_S = 0.02
LATENCY_S = RTT_S * RTTS_PER_TASK + POLL_S
# On this machine the round trip is a veth pair: its latency is the poll alone.
LOCAL_LATENCY_S = POLL_S


CALIBRATE = 2  # nodes: the size that sets the fixed wait


def model(rows: list[dict], method: str = "d", view: str = "shared",
          fit_from: int = 8, cores: int = 2, fit_to: int = 1 << 30) -> dict | None:
    """Fit the launch's costs over the sizes fit_from..fit_to of one view:

    controller CPU C(N) = a + b N, split into the serial part S(N) = s0 + s1 N (the driver's
    and ansible-playbook's main process, one core whatever the controller has) and the rest
    P(N) = p0 + p1 N (forked workers, ssh clients and multiplexers, rsync: spread over the
    controller's cores); torchherd's own CPU on a node o (the method's node CPU less pdsh's,
    median over the sizes); peak controller memory M(N) = m0 + m1 N; round trips R before the
    job starts and R_total in the whole launch; a fixed wait W (time without CPU), the part
    of the extra wall time at CALIBRATE nodes that the CPU terms do not explain."""
    pts = [r for r in rows if r["view"] == view and fit_from <= r["nodes"] <= fit_to
           and r[method].get("cpu_s") is not None and r["b"].get("cpu_s") is not None]
    if not pts:
        return None
    xs = [r["nodes"] for r in pts]
    a, b = fit_line(xs, [r[method]["cpu_s"] for r in pts])
    serial = [r[method].get("serial_cpu") or 0.0 for r in pts]
    s0, s1 = fit_line(xs, serial)
    p0, p1 = fit_line(xs, [r[method]["cpu_s"] - s for r, s in zip(pts, serial, strict=True)])
    own = [(r["nodes"], r[method]["own_node_cpu"]) for r in pts if "own_node_cpu" in r[method]]
    # A node's own work does not grow with the others (one facts, one start, one collect
    # each): the median over the sizes, not a line (one noisy repetition would set a slope).
    o0, o1 = (statistics.median(y for _, y in own), 0.0) if own else (0.0, 0.0)
    mem = [(r["nodes"], r[method]["peak_rss_mb"]) for r in pts if r[method].get("peak_rss_mb")]
    m0, m1 = fit_line([x for x, _ in mem], [y for _, y in mem]) if mem else (0.0, 0.0)
    trips = max(r[method].get("trips") or 0 for r in pts)
    trips_total = max(r[method].get("trips_total") or 0 for r in pts)
    # The waits that use no CPU: at CALIBRATE nodes the launch is chain-bound, and what the
    # chain does not explain is taken as a fixed wait (both views, median).
    resid = [c["measured_done"] - c["chain"] for r in rows if r["nodes"] == CALIBRATE
             for c in [check_here(r, method, cores)] if c]
    wait = statistics.median(resid) if resid else 0.0
    return {"wait_s": wait, "wait_points": resid, "method": method, "view": view,
            "sizes": xs, "ctrl": [a, b], "serial": [s0, s1],
            "parallel": [p0, p1], "own_node": [o0, o1], "own_node_points": own,
            "mem": [m0, m1], "trips": trips, "trips_total": trips_total,
            "latency_s": LATENCY_S}


def predict(m: dict, n: int, cores: int) -> dict:
    """A real cluster: the nodes work in parallel, each on its own CPUs (torchherd's own node
    CPU paid once, not n times); the controller's serial part on one core, the rest over
    `cores`; each round trip beyond pdsh's one adds the stated latency. What pdsh itself costs
    (one ssh per node, about 0.02 CPU-s each) is left out on both sides."""
    serial = m["serial"][0] + m["serial"][1] * n
    parallel = (m["parallel"][0] + m["parallel"][1] * n) / cores
    node = m["own_node"][0] + m["own_node"][1] * n
    trips = (m["trips_total"] - 1) * m["latency_s"]
    wait = max(m.get("wait_s", 0.0), 0.0)
    simple = m["ctrl"][0] + m["ctrl"][1] * n / cores + node + trips + wait
    return {"nodes": n, "cores": cores, "serial_s": serial, "parallel_s": parallel,
            "node_s": node, "trips_s": trips, "wait_s": wait,
            "total_s": serial + parallel + node + trips + wait,
            "simple_s": simple, "mem_mb": m["mem"][0] + m["mem"][1] * n,
            "ctrl_cpu_s": m["ctrl"][0] + m["ctrl"][1] * n}


def check_here(row: dict, method: str, cores: int, wait: float = 0.0) -> dict | None:
    """The model on this machine, against the measured extra wall time over pdsh (done, and
    init). Two bounds, the larger wins: the chain T(N, K) with this machine's K (the serial
    controller part, the rest over the controller's cores, torchherd's node CPU once, the
    round trips at the poll interval: a veth round trip is free), and the work bound: here
    the nodes are no help, every extra CPU-second (controller: the method less pdsh; nodes:
    N x torchherd's own) needs a core of the machine. Shared view: the controller and all
    nodes on all `cores`: work / cores. Separate view: the controller on CPU 0 and all nodes
    on CPU 1: between the larger of the two (overlapped) and their sum (not)."""
    n, r, b = row["nodes"], row[method], row["b"]
    if r.get("cpu_s") is None or b.get("cpu_s") is None or "own_node_cpu" not in r:
        return None
    ctrl = r["cpu_s"] - b["cpu_s"]
    serial = r.get("serial_cpu") or 0.0
    node = n * r["own_node_cpu"]
    trips = ((r.get("trips_total") or 1) - 1) * LOCAL_LATENCY_S
    out = {"nodes": n, "view": row["view"], "ctrl_extra": ctrl, "node_extra": node,
           "measured_done": r["done_s"] - b["done_s"],
           "measured_init": (r["init_s"] - b["init_s"]) if r.get("init_s") and b.get("init_s")
           else None}
    ctrl_cores = 1 if row["view"] == "separate" else cores
    chain = serial + (ctrl - serial) / ctrl_cores + r["own_node_cpu"] + trips + wait
    out["chain"] = chain
    if row["view"] == "separate":
        out["pred_low"] = max(chain, max(ctrl, node) + trips)
        out["pred_high"] = max(chain, ctrl + node + trips)
    else:
        out["pred_low"] = out["pred_high"] = max(chain, (ctrl + node) / cores + trips)
    out["bound"] = "chain" if chain >= out["pred_low"] else "work"
    return out
