"""bench/run.py --delay-ms: the container-node arms through a relay that adds a round trip.

Each delay (a round-trip time in ms) gets an ssh_config whose ProxyCommand is
bench/delay_relay.py: every SSH connection of pdsh (PDSH_SSH_ARGS_APPEND: -F) and of
torchherd's Ansible (the inventory's ansible_ssh_common_args: -F), and of the collect's rsync,
which reuses Ansible's ssh command line, goes through it. The relay counts per connection;
this module sets it up, reads its counters per launch, and writes the tables and plot of a
delay run (docs/benchmark.md, docs/benchmark.png).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

RELAY = Path(__file__).resolve().with_name("delay_relay.py")
ORDER = "abcgd"  # the methods' order in tables
SYSTEM_SSH_CONFIG = Path("/etc/ssh/ssh_config")


def label(delay: float) -> str:
    return f"{delay:g}"


def setup(work: Path, delays: list[float]) -> dict[float, dict]:
    """One ssh_config per delay, all writing counters into work/relay."""
    stats = work / "relay"
    stats.mkdir(exist_ok=True)
    out = {}
    for delay in delays:
        cfg = work / f"ssh_config-{label(delay)}ms"
        proxy = (f"{shlex.quote(sys.executable)} -S {shlex.quote(str(RELAY))} "
                 f"--rtt-ms {label(delay)} --stats-dir {shlex.quote(str(stats))} %h %p")
        lines = ["# bench/run.py --delay-ms: every connection through the delaying relay",
                 "Host *", f"    ProxyCommand {proxy}"]
        if SYSTEM_SSH_CONFIG.exists():
            # -F replaces the system's file: read it too, so that ssh behaves as by default
            # but for the ProxyCommand (first value wins: ours comes first).
            lines.append(f"    Include {SYSTEM_SSH_CONFIG}")
        cfg.write_text("\n".join(lines) + "\n")
        out[delay] = {"rtt_ms": delay, "config": cfg, "stats": stats}
    return out


def inventory(src: Path, dest: Path, config: Path) -> Path:
    """The cluster's inventory with `-F config` in front of its ansible_ssh_common_args."""
    text = src.read_text()
    key = "ansible_ssh_common_args='"
    if key not in text:
        raise RuntimeError(f"{src}: no {key} to add the relay's ssh_config to")
    dest.write_text(text.replace(key, f"{key}-F {config} "))
    return dest


def snapshot(stats: Path, prefix: str) -> dict[str, dict]:
    """Every relay's counters, by file, whose tag starts with `prefix`."""
    out = {}
    for path in stats.glob(f"{prefix}*.json"):
        try:
            out[path.name] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return out


COUNTED = ("exchanges", "bytes_up", "bytes_down", "cpu_s")


def counters(stats: Path, prefix: str, before: dict[str, dict], settle: float = 0.3) -> dict:
    """What the relays of `prefix` counted during one launch (now less `before`): new
    connections, request-answer exchanges (on new connections and on ones kept from an
    earlier launch: ssh multiplexers), bytes, the relays' own CPU. An open connection is read
    as of now: a relay writes its counters within 50 ms of any traffic."""
    time.sleep(settle)
    after = snapshot(stats, prefix)
    per = []
    for name, c in after.items():
        old = before.get(name) or {}
        per.append({k: c.get(k, 0) - old.get(k, 0) for k in COUNTED} |
                   {"new": name not in before, "closed": c.get("closed"),
                    "error": c.get("error")})
    ex = [c["exchanges"] for c in per if c["exchanges"] or c["new"]]
    return {"connections": sum(c["new"] for c in per),
            "reused": sum(not c["new"] and c["exchanges"] > 0 for c in per),
            "open": sum(not c["closed"] for c in per if c["new"]),
            "exchanges": sum(ex), "exchanges_max": max(ex, default=0),
            "exchanges_med": statistics.median(ex) if ex else 0,
            "bytes_up": sum(c["bytes_up"] for c in per),
            "bytes_down": sum(c["bytes_down"] for c in per),
            "relay_cpu_s": round(sum(c["cpu_s"] for c in per), 3),
            "errors": [c["error"] for c in per if c["error"] and c["new"]][:3]}


def shell_env(env: dict[str, str], tag: str) -> dict[str, str]:
    return {**env, "THBENCH_RELAY_TAG": tag}


def torchherd_env(env: dict[str, str], extra_env: dict[str, str], tag: str,
                  cp_dir: Path) -> dict[str, str]:
    """A launch as by a user with no Ansible configuration of their own: no ANSIBLE_CONFIG
    (unless --env gives one), run from an empty directory (no ./ansible.cfg), so that the
    driver's own settings hold (driver/ansible.cfg; its ssh_args where the caller sets none:
    ControlMaster=auto, ControlPersist of the driver's choice). Its ssh multiplexers in one
    directory per size and delay, shared by the launches there: a launch reuses the
    connections that the launch before it left, as by default (method g ends them first)."""
    out = {k: v for k, v in env.items() if k not in ("ANSIBLE_CONFIG", "ANSIBLE_SSH_ARGS")}
    out.update(extra_env)
    out["THBENCH_RELAY_TAG"] = tag
    out["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(cp_dir)
    return out


def cold(cp_dir: Path) -> int:
    """Method g: end the ssh multiplexers of cp_dir (and their relays), so that the next
    launch opens new connections."""
    killed = kill_masters(cp_dir)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(mux_pids(cp_dir)):
        time.sleep(0.05)
    if cp_dir.is_dir():
        for sock in cp_dir.iterdir():  # a socket a killed master left behind
            sock.unlink(missing_ok=True)
    return killed


# --------------------------------------------------------------------------------------------
# summary and docs


def med(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def summarize(sizes: list[dict], methods: str = ORDER) -> list[dict]:
    """One row per size and delay: per method the medians over the repetitions."""
    rows = []
    for s in sizes:
        n = s["nodes"]
        for delay in s.get("delays") or []:
            row = {"nodes": n, "delay_ms": delay}
            for m in methods:
                runs = [r for r in s["runs"] if r["method"] == m and r["ok"]
                        and r.get("delay_ms") == delay]
                if not runs:
                    continue
                rel = [r.get("relay") or {} for r in runs]
                cpu = med([r["cpu_s"] for r in runs])  # the relays' CPU is not in it
                ctrl = cpu
                row[m] = {
                    "n": len(runs), "done_s": med([r["done_s"] for r in runs]),
                    "init_s": med([r.get("init_s") for r in runs]),
                    "done_all": [round(r["done_s"], 2) for r in runs],
                    "cpu_s": cpu, "ctrl_cpu_s": ctrl, "cpu_per_node": ctrl / n,
                    "connections": med([x.get("connections") for x in rel]),
                    "exchanges": med([x.get("exchanges") for x in rel]),
                    "exchanges_per_conn_max": med([x.get("exchanges_max") for x in rel]),
                    "relay_cpu_s": med([x.get("relay_cpu_s") for x in rel]),
                    "tasks_per_node": max((r["round_trips"]["max"] for r in runs
                                           if r.get("round_trips")), default=None),
                    "tasks_per_node_all": max((r["round_trips"].get("total_max", 0)
                                               for r in runs if r.get("round_trips")),
                                              default=None)}
            rows.append(row)
    return rows


START_TASK = "Start torchrun on every node"
FOLD_BELOW = 0.05  # seconds: tasks on the controller that the delay changed less are summed


def task_table(sizes: list[dict], n: int, method: str = "d") -> list[str]:
    """Per task of the relaunch at n nodes: median seconds at each delay, the difference, and
    whether it ran on the nodes (the round_trips probe's tasks before the start)."""
    s = next((x for x in sizes if x["nodes"] == n), None)
    if not s:
        return []
    delays = sorted(s.get("delays") or [])
    per: dict[float, list[list]] = {}
    remote: dict[str, bool] = {}
    for delay in delays:
        runs = [r for r in s["runs"] if r["method"] == method and r["ok"]
                and r.get("delay_ms") == delay and r.get("tasks")]
        per[delay] = [r["tasks"] for r in runs]
        for r in runs:
            for t in (r.get("round_trips") or {}).get("tasks") or []:
                remote[t["task"]] = remote.get(t["task"], False) or bool(t.get("remote"))
    if len(delays) < 2 or not all(per.values()):
        return []
    def keyed(tasks: list[list]) -> dict[tuple[str, int], float]:
        """(name, how many tasks of that name came before) -> seconds: runs whose task lists
        differ (a task one run has and another not) still line up by name."""
        seen: dict[str, int] = {}
        out = {}
        for name, secs in tasks:
            out[(name, seen.get(name, 0))] = secs
            seen[name] = seen.get(name, 0) + 1
        return out

    by_delay = {d: [keyed(t) for t in per[d]] for d in delays}
    keys = list(keyed(per[delays[0]][0]))
    names = [k[0] for k in keys]
    lo, hi = delays[0], delays[-1]
    lines = [f"| task | {label(lo)} ms (s) | {label(hi)} ms (s) | difference (s) "
             f"| round trips' worth ({label(hi)} - {label(lo)} ms) | on the nodes |",
             "|---|---|---|---|---|---|"]
    rows = []
    start = next((i for i, name in enumerate(names) if name == START_TASK), len(names))
    for i, name in enumerate(names):
        vals = {}
        for delay in delays:
            vals[delay] = med([t.get(keys[i]) for t in by_delay[delay]])
        a, b = vals[lo], vals[hi]
        diff = b - a if a is not None and b is not None else None
        trips = diff / ((hi - lo) / 1000.0) if diff is not None else None
        where = "yes" if remote.get(name) else ("play" if name.startswith("play: ") else
                                                ("after the start" if i > start else "no"))
        rows.append((name, a, b, diff, trips, where))
    rest = [r for r in rows if r[5] != "yes" and abs(r[3] or 0.0) < FOLD_BELOW]
    for name, a, b, diff, trips, where in rows:
        if (name, a, b, diff, trips, where) in rest:
            continue
        lines.append(f"| {name} | {fmt(a)} | {fmt(b)} | {fmt(diff, '+.2f')} "
                     f"| {fmt(trips, '.0f')} | {where} |")
    if rest:
        a = sum(r[1] or 0.0 for r in rest)
        b = sum(r[2] or 0.0 for r in rest)
        lines.append(f"| the {len(rest)} other tasks and plays (each under "
                     f"{FOLD_BELOW:g} s of difference), together | {a:.2f} | {b:.2f} "
                     f"| {b - a:+.2f} | {(b - a) / ((hi - lo) / 1000.0):.0f} | no |")
    total = sum(r[3] for r in rows if r[3] is not None)
    lines.append(f"| **all tasks** | | | **{total:+.2f}** "
                 f"| {total / ((hi - lo) / 1000.0):.0f} | |")
    return lines


def phase_table(sizes: list[dict], n: int, method: str = "d") -> list[str]:
    s = next((x for x in sizes if x["nodes"] == n), None)
    if not s:
        return []
    delays = sorted(s.get("delays") or [])
    order = ["plan", "preflight", "sync", "firewall", "start", "watch", "collect", "total"]
    found: dict[float, dict[str, float | None]] = {}
    keys: list[str] = []
    for delay in delays:
        runs = [r for r in s["runs"] if r["method"] == method and r["ok"]
                and r.get("delay_ms") == delay and r.get("timings")]
        for r in runs:
            keys += [k for k, v in r["timings"].items()
                     if isinstance(v, (int, float)) and k not in keys]
        found[delay] = {k: med([r["timings"].get(k) for r in runs
                                if isinstance(r["timings"].get(k), (int, float))])
                        for k in keys}
    keys.sort(key=lambda k: order.index(k) if k in order else len(order))
    head = " | ".join(f"{label(d)} ms" for d in delays)
    lines = [f"| phase | {head} |", "|---" * (len(delays) + 1) + "|"]
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(fmt(found[d].get(k)) for d in delays) + " |")
    return lines


METHOD_NAMES = {"a": "ssh loop", "b": "pdsh", "c": "torchherd launch (a changed file)",
                "d": "torchherd relaunch", "g": "torchherd relaunch, new SSH connections"}


def write_markdown(path: Path, infos: list[dict], rows: list[dict], sizes: list[dict],
                   note: str, command: str) -> None:
    info = infos[0]
    methods = [m for m in ORDER if any(m in r for r in rows)]
    runs_of = "; ".join(f"{i.get('file') or 'this run'}: commit {i.get('commit')}, "
                        f"{i.get('date')}, load average at start "
                        f"{' '.join(f'{x:.2f}' for x in i['loadavg'])}, "
                        f"{i.get('sizes', '-')} nodes" for i in infos)
    commits = ", ".join(dict.fromkeys(str(i.get("commit_full") or i.get("commit"))
                                      for i in infos))
    lines = [
        "# Benchmark: launch time over a network with round trips",
        "",
        "Generated by `bench/run.py --delay-ms` (bench/README.md). " + note,
        "",
        "```",
        command,
        "```",
        "",
        f"Code: commit{'s' if ', ' in commits else ''} {commits}. Machine: "
        f"{info['nproc']} CPUs ({info['cpu']}), {info['mem_gib']:.1f} GiB; runs (results in "
        f"bench/results/): {runs_of}. "
        "Nodes are podman containers on this same machine, reached over real SSH; they share "
        "its CPUs, so the floor (torch import and init on every node) grows with the nodes.",
        "",
        "**The network.** Every SSH connection, of pdsh and of torchherd's Ansible alike (and "
        "the collect's rsync, which reuses Ansible's ssh command line), goes through "
        "`bench/delay_relay.py` as its ssh ProxyCommand (one `ssh_config` per delay, given "
        "with `-F`, which includes the system's /etc/ssh/ssh_config). The delay is the "
        "**round trip**: the relay holds every chunk half of it in each direction. Each tool "
        "keeps its own SSH defaults: pdsh opens one plain connection per node (no "
        "multiplexing); torchherd runs as for a user with no Ansible configuration (no "
        "ANSIBLE_CONFIG, no ansible.cfg in the working directory: the driver's own "
        "driver/ansible.cfg and its ssh_args where the caller sets none, "
        f"`{info.get('own_ssh_args') or '-'}`, pipelining on): one SSH connection per node, "
        "kept after the launch, which every later task and launch reuses while it lives. So "
        "two relaunches: *g* ends those connections first (a relaunch after they expired, or "
        "after `torchherd disconnect`: every node's handshake again), *d* comes right after g "
        "and reuses g's (the default case of a relaunch within the ControlPersist time).",
        "",
        "examples/allreduce.py, one process per node; " + ", ".join(
            f"{m} = {METHOD_NAMES[m]}" for m in methods) + ". Before the repetitions one "
        "untimed torchherd launch on every fresh cluster (the code's first sync, the torch "
        "probe's cache), so every relaunch measured is a relaunch. Repetitions alternate the "
        "delays and the methods. Medians.",
        "",
        "*wall*: seconds from the command's start to its return (every rank done). *CPU/node*: "
        "the controller's CPU-seconds of the launching process tree (ssh multiplexers "
        "included, the relays' own CPU not) per node. *connections*: SSH connections through "
        "the relay during the launch (TCP connections: one relay process each; d's are g's, "
        "kept). *exchanges*: request-answer turns the relay saw during the launch (bytes from "
        "the server after bytes from the client; each costs a round trip), all connections "
        "together / the most on one connection (median over the repetitions): the nodes' "
        "connections run side by side, so the second figure times the round trip is about "
        "what the delay adds to the launch. *tasks/node*: the round_trips probe: tasks that "
        "ran on a node up to the start (whole launch in brackets). *critical round trips* "
        "(below the table): (wall at the largest delay - wall at the smallest) / the "
        "difference of the delays, which the machine's load can swamp.",
        "",
    ]
    head = ["nodes", "RTT (ms)", "reps"]
    for m in methods:
        head += [f"wall {m} (s)"]
    ratios = [m for m in methods if m in "cgd"] if "b" in methods else []
    head += [f"{m}/b" for m in ratios]
    for m in methods:
        head += [f"CPU/node {m} (s)"]
    head += [f"connections {m}" for m in methods]
    head += [f"exchanges {m}" for m in methods]
    if "d" in methods:
        head += ["tasks/node d"]
    lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for r in rows:
        reps = "/".join(str(r[m]["n"]) if m in r else "0" for m in methods)
        cells = [str(r["nodes"]), label(r["delay_ms"]), reps]
        cells += [fmt(r[m]["done_s"]) if m in r else "-" for m in methods]
        for m in ratios:
            ok = "b" in r and m in r
            cells += [fmt(r[m]["done_s"] / r["b"]["done_s"]) if ok else "-"]
        cells += [fmt(r[m]["cpu_per_node"], ".3f") if m in r else "-" for m in methods]
        cells += [fmt(r[m]["connections"], ".0f") if m in r else "-" for m in methods]
        cells += [f"{r[m]['exchanges']:.0f} / {r[m]['exchanges_per_conn_max']:.0f}"
                  if m in r else "-" for m in methods]
        if "d" in methods:
            cells += [f"{r['d']['tasks_per_node']} ({r['d']['tasks_per_node_all']})"
                      if "d" in r else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    sizes_n = sorted({r["nodes"] for r in rows})
    crit = []
    for n in sizes_n:
        mine = sorted((r for r in rows if r["nodes"] == n), key=lambda r: r["delay_ms"])
        if len(mine) < 2:
            continue
        lo, hi = mine[0], mine[-1]
        step = hi["delay_ms"] - lo["delay_ms"]
        parts = []
        for m in methods:
            if m not in lo or m not in hi:
                continue
            measured = hi[m]["done_s"] - lo[m]["done_s"]
            trips = hi[m]["exchanges_per_conn_max"]
            parts.append(f"{METHOD_NAMES[m]} {measured:+.2f} s measured, "
                         f"{trips * step / 1000.0:.2f} s from the relay ({trips:.0f} round trips "
                         f"on the busiest connection)")
        crit.append(f"{n} nodes: " + "; ".join(parts))
    if crit:
        lines += ["", "The delay's cost, wall at the largest delay less wall at the smallest, "
                  "against what the relay's count predicts: " + ". ".join(crit) + ". "
                  "Where the measured difference is far from the prediction, the machine's "
                  "load (other work on these 2 cores) moved the runs more than the delay did.",
                  ""]
    else:
        lines += [""]
    lines += ["Every run's wall time (s), in order of the repetitions:", ""]
    for r in rows:
        lines.append(f"- {r['nodes']} nodes, {label(r['delay_ms'])} ms: " + "; ".join(
            f"{m} {', '.join(str(x) for x in r[m]['done_all'])}" for m in methods if m in r))
    for n in sizes_n:
        for m in [x for x in "dg" if x in methods]:
            table = task_table(sizes, n, m)
            if not table:
                continue
            lines += ["", f"## Where the time of {METHOD_NAMES[m]} ({m}) goes at {n} nodes",
                      "",
                      "Per task (start to the next task's start, ansible-runner events), "
                      "medians at each delay. *round trips' worth*: the difference over the "
                      "difference of the delays. *on the nodes*: up to the start, whether the "
                      "round_trips probe saw the task run on a node (not on the controller "
                      "alone, not delegated, not skipped); the tasks after the start are the "
                      "watch (its wait on the master node lasts as long as the job) and the "
                      "collect (rsync from the controller over each node's SSH connection). "
                      "The tasks not on the nodes that the delay moved by less than "
                      f"{FOLD_BELOW:g} s are summed in one line.", ""]
            lines += table
            phases = phase_table(sizes, n, m)
            if phases:
                lines += ["", "Phases (summary.json timings), medians:", ""] + phases
    path.write_text("\n".join(lines) + "\n")


def write_plot(path: Path, rows: list[dict]) -> None:
    try:
        import matplotlib
    except ImportError:  # as bench/run.py's own plot does
        import subprocess
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "matplotlib"], check=True)
        import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4.5))
    delays = sorted({r["delay_ms"] for r in rows})
    styles = ["-", "--", ":", "-."]
    colors = {"a": "C0", "b": "C1", "c": "C2", "d": "C3", "g": "C4"}
    xs_all = sorted({r["nodes"] for r in rows})
    for i, delay in enumerate(delays):
        drows = [r for r in rows if r["delay_ms"] == delay]
        for m in ORDER:
            mrows = [r for r in drows if m in r]
            if not mrows:
                continue
            xs = [r["nodes"] for r in mrows]
            kw = {"marker": "os^D"[i % 4], "ls": styles[i % len(styles)], "color": colors[m],
                  "label": f"{METHOD_NAMES[m]}, RTT {label(delay)} ms"}
            ax1.plot(xs, [r[m]["done_s"] for r in mrows], **kw)
            ax2.plot(xs, [r[m]["cpu_per_node"] for r in mrows], **kw)
            ax3.plot(xs, [r[m]["exchanges"] for r in mrows], **kw)
    ax1.set(xlabel="nodes", ylabel="seconds to done (median)", title="Launch to done")
    ax2.set(xlabel="nodes", ylabel="controller CPU-s per node", title="Controller CPU per node")
    ax3.set(xlabel="nodes", ylabel="request-answer exchanges (all connections)",
            title="SSH exchanges through the relay")
    ax3.set_yscale("log")
    for ax in (ax1, ax2, ax3):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs_all, [str(x) for x in xs_all])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def mux_pids(cp_dir: Path) -> list[int]:
    """The pids of the live ssh ControlPersist masters whose sockets are under cp_dir."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if f"{cp_dir}/" in cmd and "[mux]" in cmd:
            found.append(int(entry.name))
    return found


def kill_masters(cp_dir: Path) -> int:
    """End the ssh ControlPersist masters this run left under cp_dir (found by their command
    line, ended by pid); their relays end with them."""
    killed = 0
    for pid in mux_pids(cp_dir):
        try:
            os.kill(pid, 15)
            killed += 1
        except OSError:
            pass
    return killed
