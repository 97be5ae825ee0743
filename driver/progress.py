"""Per-node progress from ansible-runner events: node, rank, phase, state, elapsed time, the
job's last line.

Phases carry the names of the data flow (plan, preflight, sync, firewall, start, watch,
collect, teardown, summary) and of the run actions (status, stop). They come from what every
event carries as Ansible's contract, never from task or play display names: the module a task
runs and the role it belongs to (see PHASES). Only chosen fields of a result are read, so that
nothing it shows can carry a secret value.

While the job runs, its output reaches the controller only in the watch's rounds (each round
of the wait returns the node's last log line, ``runner_retry``; where the master's wait speaks
for its gang, every node's last line as the gang heard it, ``nodes``, and for a live view the
round returns as soon as one changed): the table shows the last line a rank printed there, not
torch's or the launcher's own warnings and banners. Elapsed times are
counted on the controller's clock from when the start reported the job running, so that a node
whose clock is off shows the same time as the others.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from rich.markup import escape
from rich.table import Table

from driver.logs import LogLine, parse_line

# The contract between the collection and this view: the module that does each phase's work,
# as Ansible reports it in every task's events (resolved_action, its FQCN, whatever the task
# is called). Where one module serves several phases, the role's task file it is called from
# ("role/file", the file named in task_path) or else its role ("" for a playbook's own task)
# tells which. task_args cannot tell a module's state apart: it is empty unless
# display_args_to_stdout is set, and censored under no_log. Tasks of other modules (set_fact,
# assert, includes) keep the phase they run in. Renaming a role, a role's task file or a
# module of this table changes the contract: change it here too.
PHASES: dict[str, str | dict[str, str]] = {
    "torchherd.cluster.code_hash": "plan",
    "torchherd.cluster.plan_run": "plan",
    "torchherd.cluster.run_record": {"plan": "plan", "preflight": "preflight"},
    "torchherd.cluster.node_facts": "preflight",
    "torchherd.cluster.tcp_probe": "preflight",
    "torchherd.cluster.interconnect": "interconnect",
    "torchherd.cluster.job_stacks": "stacks",
    "torchherd.cluster.rsync": {"sync": "sync", "collect": "collect"},
    "torchherd.cluster.firewall_rules": {"firewall": "firewall", "firewall/teardown": "teardown",
                                         "firewall/teardown_all": "teardown"},
    "torchherd.cluster.torchrun_job": {"torchrun/start": "start", "torchrun/wait": "watch",
                                       "torchrun/stop": "stop", "torchrun/stop_all": "stop",
                                       "": "status"},
    "torchherd.cluster.run_summary": "summary",
}
# What a node's successful result of a phase's module means for its row.
_DONE = {("torchherd.cluster.node_facts", "preflight"): "checked",
         ("torchherd.cluster.rsync", "sync"): "synced"}
# States a node passes through on the way to its job; their notes do not outlive them.
_PASSING = ("ok", "checked", "synced")
_STATE_STYLE = {"succeeded": "green", "running": "cyan", "failed": "red", "lost": "red",
                "unreachable": "red", "timed_out": "red", "preflight failed": "red",
                "left out": "yellow", "standby": "yellow",
                "stopped": "yellow"}
_NOTE_WIDTH = 100
# Lines a rank or the launcher writes that are not the job's own words: Python's warnings (the
# "UserWarning: ..." line and the source line after it), glog-style lines of torch's C++ side
# ("[W1125 18:05:51.1 socket.cpp:...]", "W1125 ..."), Python logging of torch.distributed, and
# torchrun's banner about OMP_NUM_THREADS.
_NOT_JOB = re.compile(r"\w*Warning: |^\s*warnings\.warn\(|^\[?[WIEF]\d{4} |^\*{5,}$"
                      r"|^(WARNING|INFO|DEBUG):torch\.|^Setting OMP_NUM_THREADS ")


@dataclass
class Row:
    rank: str = ""
    phase: str = ""
    state: str = ""
    note: str = ""
    started: float | None = None  # controller time the job was first seen running here
    ended: float | None = None  # controller time it was first seen ended
    rank_line: bool = False  # the note is a line a rank printed
    use: str = ""  # the node's last sample of its use, as the node put it in a cell


def job_line(line: LogLine) -> bool:
    """Whether a node-log line is the job's own output worth showing as its last line."""
    return bool(line.text.strip()) and not _NOT_JOB.search(line.text)


def elapsed(seconds: float | None) -> str:
    """Seconds as the table shows them: 7s, 3m05s, 2h01m."""
    if seconds is None:
        return ""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def row_cells(host: str, row: Row, now: float) -> list[str]:
    """One node's cells of the live table (markup escaped): node, rank, phase, state,
    elapsed, last line."""
    style = _STATE_STYLE.get(row.state)
    state = f"[{style}]{escape(row.state)}[/]" if style else escape(row.state)
    since = None if row.started is None else (row.ended or now) - row.started
    return [escape(host), row.rank, row.phase, state, elapsed(since), escape(row.note)]


def module_of(data: dict[str, Any]) -> str:
    """The FQCN of the module an event's task runs (as written, where Ansible resolved none)."""
    return data.get("resolved_action") or data.get("task_action") or ""


def phase_of(data: dict[str, Any], current: str) -> str:
    """The phase of the task an event belongs to (see PHASES); ``current`` for other tasks."""
    phases = PHASES.get(module_of(data), current)
    if isinstance(phases, str):
        return phases
    role = data.get("role") or ""
    if not role:
        return phases.get("", current)
    task_file = PurePath(str(data.get("task_path") or "").rsplit(":", 1)[0]).stem
    return phases.get(f"{role}/{task_file}") or phases.get(role) or current


def _first_line(value: Any) -> str:
    text = str(value or "").strip()
    return text.splitlines()[0][:_NOTE_WIDTH] if text else ""


def gib(size: int | None) -> str:
    """Bytes in GiB with one decimal, as the facts table shows disk space."""
    return "-" if size is None else f"{size / 2**30:.1f} GiB"


def gpus_text(gpus: list[dict[str, Any]]) -> str:
    """GPUs as count x model ("8 x NVIDIA H100 80GB HBM3", models in the order seen); cpu
    where torch sees none."""
    counts: dict[str, int] = {}
    for gpu in gpus:
        counts[str(gpu.get("name") or "?")] = counts.get(str(gpu.get("name") or "?"), 0) + 1
    return ", ".join(f"{n} x {name}" for name, n in counts.items()) or "cpu"


def rdma_text(facts: dict[str, Any]) -> str:
    """The InfiniBand/RoCE ports and, per GPU, the nearest of them ("mlx5_0:1 ACTIVE; gpu0
    mlx5_0 PIX")."""
    near = [f"gpu{i} {'/'.join(gpu['nics'])} {gpu.get('link')}"
            for i, gpu in enumerate(facts.get("gpus") or []) if gpu.get("nics")]
    return "; ".join(part for part in (", ".join(facts.get("rdma") or []), ", ".join(near))
                     if part)


_CHECK_STYLE = {"passed": "green", "failed": "red", "unreachable": "red"}


def facts_cells(host: str, facts: dict[str, Any]) -> list[str]:
    """One node's cells of verify's facts table (markup escaped): node, rank, python, torch,
    cuda, nccl, gpus, launchers, interface, disk free, shm, rdma, check (and the warnings)."""
    rank = facts.get("node_rank")
    role = f"{'' if rank is None else rank} {facts.get('role') or ''}".strip()
    interface = facts.get("interface") or {}
    where = " ".join(str(interface[k]) for k in ("name", "address") if interface.get(k))
    check = str(facts.get("check") or "")
    if facts.get("failed_checks"):
        check += ": " + ", ".join(facts["failed_checks"])
    if facts.get("warned_checks"):
        check += "; warned: " + ", ".join(facts["warned_checks"])
    launchers = " ".join(f"{name} {version}" for name, version
                         in (facts.get("launchers") or {}).items() if version)
    style = _CHECK_STYLE.get(str(facts.get("check")))
    python = facts.get("python")
    venv = facts.get("venv") or {}
    if python and venv:
        python += (f" venv made {venv.get('seconds') or 0:.1f} s" if venv.get("made")
                   else " venv")
    image = facts.get("container") or {}
    if python and image:
        python += (f" in image, pulled {image.get('seconds') or 0:.1f} s" if image.get("pulled")
                   else " in image")
    cells = [host, role, python, facts.get("torch"), facts.get("cuda"),
             facts.get("nccl"), gpus_text(facts.get("gpus") or []) if facts.get("torch") else None,
             launchers, where, gib(facts.get("disk_free_bytes")), gib(facts.get("shm_bytes")),
             rdma_text(facts)]
    shown = [escape(str(c)) if c not in (None, "") else "-" for c in cells]
    return shown + [f"[{style}]{escape(check)}[/]" if style else escape(check)]


class Progress:
    """Fold ansible-runner events into one row per node; render a table or plain lines."""

    def __init__(self, title: str = "torchherd", now: float | None = None) -> None:
        self.title = title
        self.rows: dict[str, Row] = {}
        self.phase = ""
        self.nproc: int | None = None
        self.static = True  # global rank = node_rank * nproc + local rank (static rendezvous)
        self.began = time.time() if now is None else now
        # The nodes whose GPUs the gang last said sit idle while the others' work.
        self.idle: set[str] = set()
        # How many waves each task runs in where there are fewer Ansible forks than nodes (the
        # schedule's waves, and why); 1 where there is a worker per node.
        self.waves = 1
        # A live display renders the table from its own thread while events are folded in.
        self._lock = threading.Lock()

    def _row(self, host: str) -> Row:
        return self.rows.setdefault(host, Row(phase=self.phase))

    def _parse(self, host: str, line: str) -> LogLine:
        row = self.rows.get(host)
        node_rank = int(row.rank) if row and row.rank.isdigit() else None
        nproc = self.nproc if self.static else None
        return parse_line(host, node_rank, nproc, line)

    def _note(self, host: str, line: str) -> str:
        return _first_line(self._parse(host, line).short)

    def _running_note(self, host: str, line: str) -> str | None:
        """The note of a running job's last line; None (the note kept) for a line that is
        not the job's, or the launcher's where a rank's line is shown already."""
        parsed = self._parse(host, line)
        row = self._row(host)
        from_rank = parsed.local_rank is not None
        if not job_line(parsed) or (row.rank_line and not from_rank):
            return None
        row.rank_line = from_rank
        return _first_line(parsed.short)

    def _enter(self, phase: str) -> list[str]:
        if phase == self.phase:
            return []
        self.phase = phase
        if phase == "watch":
            # The watch speaks for every node (the master's gang, where it alone is polled).
            for row in self.rows.values():
                if row.state == "running":
                    row.phase = phase
        return [f"torchherd: {phase}"]

    def _times(self, host: str, state: str, now: float) -> None:
        row = self._row(host)
        if state == "running" and row.started is None:
            row.started = now
        elif state != "running" and row.started is not None and row.ended is None:
            row.ended = now

    def _set(self, host: str, phase: str, state: str | None = None,
             note: str | None = None) -> str | None:
        row = self._row(host)
        row.phase = phase or row.phase
        changed = state is not None and state != row.state
        if changed and note is None and row.state in _PASSING:
            row.note = ""  # what a passing state said (a venv made) is not the next one's
        if state is not None:
            row.state = state
        if note is not None:
            row.note = note
        if not changed:
            return None
        rank = f" (node_rank {row.rank})" if row.rank else ""
        # A row's note is old news in these states, unless the event brings its own.
        shown = note if state in _PASSING else row.note
        detail = f": {shown}" if shown else ""
        return f"torchherd: {host}{rank}: {row.state}{detail}"

    def update(self, event: dict[str, Any], now: float | None = None) -> list[str]:
        """Fold one event in; return the lines worth printing when there is no live table.
        ``now``: the controller's time the event came (default: the clock's)."""
        with self._lock:
            return self._update(event, time.time() if now is None else now)

    def _update(self, event: dict[str, Any], now: float) -> list[str]:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "torchherd_restart":  # the driver's, between two launches of the run id
            return self._restart(data)
        # Every playbook of the collection begins with the plan: its own, or the run's read back.
        if kind == "playbook_on_start":
            return self._enter("plan")
        phase = phase_of(data, self.phase)
        if kind == "playbook_on_task_start":
            return self._enter(phase)
        host = data.get("host")
        res = data.get("res") if isinstance(data.get("res"), dict) else {}
        if not host:
            return []
        # The plan's nodes come from localhost's tasks; the nodes preflight chose among spares
        # from a node's (run once, for all).
        if host == "localhost" or (kind == "runner_item_on_ok" and "add_host" in res):
            return self._controller(kind, phase, res)
        if kind == "runner_on_unreachable":
            return _some(self._set(host, phase, "unreachable", _first_line(res.get("msg"))))
        # A watch that ends in a failed job fails its task on purpose (the gang stop is its
        # rescue): the job's own state and last line say more than the task's message. A fail
        # task, or a debug that fails (the gate's table where it found a problem), restates
        # what was found before, on whichever host it runs (the gate's verdict runs once, for
        # all): the rows hold that already.
        if (kind == "runner_on_failed" and not data.get("ignore_errors")
                and "job_state" not in res):
            if module_of(data) in ("ansible.builtin.fail", "ansible.builtin.debug"):
                return []
            return _some(self._set(host, phase, "failed", _first_line(res.get("msg"))))
        if kind not in ("runner_on_ok", "runner_retry") and "job_state" not in res:
            return []
        if res.get("unreachable"):  # ignore_unreachable results arrive as ok
            return _some(self._set(host, phase, "unreachable", _first_line(res.get("msg"))))
        # torchrun_job's answer, or a relaunch's start that came with the facts call and went on.
        start = res["start"] if isinstance(res.get("start"), dict) else {}
        if "job_state" in res or (start.get("started") and "job_state" in start):
            return self._job(host, *((phase, res) if "job_state" in res else ("start", start)), now)
        gate = (res.get("ansible_facts") or {}).get("torchherd_gate")
        if gate:
            return self._gate(gate, phase)
        done = _DONE.get((module_of(data), phase))
        if not done or kind != "runner_on_ok":
            return []
        venv = res.get("venv") if isinstance(res.get("venv"), dict) else {}
        note = None
        if venv and not venv.get("error"):  # the job's locked venv, made here or found
            note = (f"venv made in {float(venv.get('seconds') or 0):.1f} s" if venv.get("made")
                    else "venv reused")
        image = res.get("container") if isinstance(res.get("container"), dict) else {}
        if image and not image.get("error"):  # the job's image, pulled here or found
            note = (f"image pulled in {float(image.get('seconds') or 0):.1f} s"
                    if image.get("pulled") else "image found")
        return _some(self._set(host, phase, done, note))

    def _job(self, host: str, phase: str, res: dict[str, Any], now: float) -> list[str]:
        """A node's answer about its job: state, last line (its wait's own, the newer), use."""
        if (rank := (res.get("meta") or {}).get("node_rank")) is not None:
            self._row(host).rank = str(rank)
        state, line = res["job_state"], res.get("last_line") or ""
        self._times(host, state, now)
        note = self._running_note(host, line) if state == "running" else self._note(host, line)
        used = ((res.get("record") or {}).get("use") or {}).get("now")
        if isinstance(used, str) and used:
            self._row(host).use = used
        return _some(self._set(host, phase, state, note)) + self._gang_lines(
            res.get("nodes"), host if note is not None else None)

    def _gang_lines(self, nodes: Any, own: str | None) -> list[str]:
        """Every node's last line as the master's gang heard it (its wait's ``nodes``) as the
        notes of the rows whose job still runs, but ``own``'s (the wait's node, whose own line
        it has): the master's wait alone speaks for them. Notes only, no printed line: they
        change every second. Each node's use too (its last sample's cell), and a line where a
        node's GPUs came to sit idle while the others' work (the gang's idle_for)."""
        lines: list[str] = []
        if not isinstance(nodes, dict):
            return lines
        for host, said in nodes.items():
            row = self.rows.get(host)
            if row is None or row.state != "running" or not isinstance(said, dict):
                continue
            if isinstance(said.get("use"), str) and said["use"]:
                idle = said.get("idle_for")
                if not isinstance(idle, (int, float)):
                    row.use = said["use"]
                    self.idle.discard(host)
                else:
                    row.use = f"{said['use']}, idle {elapsed(idle)}"
                    if host not in self.idle:
                        self.idle.add(host)
                        lines.append(f"{host}: its GPUs sit idle ({elapsed(idle)}) while the "
                                     "other nodes' GPUs work: a straggler or a stuck rank?")
            if host == own:
                continue
            note = self._running_note(host, str(said.get("last_line") or ""))
            if note is not None:
                row.note = note
        return lines

    def _controller(self, kind: str, phase: str, res: dict[str, Any]) -> list[str]:
        plan = (res.get("ansible_facts") or {}).get("torchherd_plan")
        schedule = (res.get("ansible_facts") or {}).get("torchherd_schedule")
        # The plan role hands both on in one task; choose.yml (spares) in one each.
        if kind == "runner_on_ok" and isinstance(plan, dict):
            self.static = (plan.get("job") or {}).get("rdzv", "static") == "static"
            if isinstance(plan.get("nproc_per_node"), int):
                self.nproc = plan["nproc_per_node"]
        if kind == "runner_on_ok" and (isinstance(plan, dict) or isinstance(schedule, dict)):
            return self._schedule(schedule) if isinstance(schedule, dict) else []
        if kind == "runner_item_on_ok" and "add_host" in res:
            added = res["add_host"]
            row = self._row(added.get("host_name", ""))
            node = (added.get("host_vars") or {}).get("torchherd_node") or {}
            rank = node.get("node_rank") if isinstance(node, dict) else None
            row.rank = "" if rank is None else str(rank)  # a spare has none until chosen
            row.state = row.state or "planned"
        elif kind == "runner_on_ok" and phase == "summary" and "summary" in res:
            summary = res.get("summary") or {}
            if isinstance(summary.get("nproc_per_node"), int):
                self.nproc = summary["nproc_per_node"]
            lines = []
            for host, h in (summary.get("hosts") or {}).items():
                row = self._row(host)
                row.rank = str(h.get("node_rank", ""))
                # The summary's times are the controller's clock too, and know when a node
                # that was not polled ended.
                for key in ("started", "ended"):
                    if isinstance(h.get(f"{key}_at"), (int, float)):
                        setattr(row, key, h[f"{key}_at"])
                note = h.get("exception") or h.get("error") or self._note(
                    host, h.get("last_line") or "")
                lines += _some(self._set(host, phase, h.get("state"), _first_line(note)))
            return lines
        return []

    def _schedule(self, schedule: dict[str, Any]) -> list[str]:
        """The launch's schedule, as the plan made it: where its tasks run in waves (fewer
        forks than nodes), the title says so, and so does a line."""
        waves = schedule.get("waves")
        if not isinstance(waves, int) or waves <= 1:
            return []
        self.waves = waves
        why = (schedule.get("why") or {}).get("waves") or f"{waves} waves"
        return [f"the launch runs in waves: {why}"]

    def _restart(self, incident: dict[str, Any]) -> list[str]:
        """A whole-job restart: the failed node's row says so, the title counts restarts."""
        node = incident.get("node")
        what = f"restart {incident.get('restart')}: {incident.get('kind')}"
        if node in self.rows:
            self._set(node, self.phase, "left out", _first_line(f"{what}: {incident.get('why')}"))
            self.rows[node].rank = ""
        self.title = f"{self.title.split(' (restart')[0]} (restart {incident.get('restart')})"
        return [f"{what}"
                + (f" of node {node}" if node else "")
                + f": {_first_line(str(incident.get('why') or ''))}; launching again"
                + (" without it" if node else "")]

    def _gate(self, gate: dict[str, Any], phase: str) -> list[str]:
        if isinstance(gate.get("nproc_per_node"), int):
            self.nproc = gate["nproc_per_node"]
        lines = []
        for problem in gate.get("problems") or []:
            for host in str(problem.get("host", "")).split(", "):
                if host in self.rows:
                    note = f"{problem.get('check')}: found {problem.get('found')}"
                    lines += _some(self._set(host, phase, "preflight failed", _first_line(note)))
        # The nodes left out where the inventory held spares (the gate on the chosen nodes).
        for host, why in (gate.get("left_out") or {}).items():
            if host in self.rows:
                self.rows[host].rank = ""
                lines += _some(self._set(host, phase, "left out", _first_line(str(why))))
        return lines

    def table(self, now: float | None = None) -> _Sized:
        """The live table at ``now`` (default: the clock's): its title has the phase and the
        time since the run began. Built for the width it is drawn in (see _USE_WIDTH)."""
        now = time.time() if now is None else now
        return _Sized(lambda width: self._table(now, width))

    def _table(self, now: float, width: int) -> Table:
        with self._lock:
            waves = f"  ({self.waves} waves)" if self.waves > 1 else ""
            table = Table(title=f"{self.title}: {self.phase}  {elapsed(now - self.began)}{waves}",
                          title_justify="left")
            # The use column once a node's use was sampled (its GPUs, else its CPU and memory),
            # where the terminal leaves the last line room beside it.
            used = width >= _USE_WIDTH and any(row.use for row in self.rows.values())
            cols = ("node", "rank", "phase", "state", "elapsed", *(("use",) if used else ()),
                    "last line")
            rows = []
            for host, row in self.rows.items():
                cells = row_cells(host, row, now)
                if used:
                    cells.insert(5, escape(row.use))
                rows.append(cells)
            # The table takes the terminal's width and the last line what the others leave:
            # where the terminal is narrow, the last line gives way, not the node or its state.
            table.expand = True
            for i, col in enumerate(cols):
                table.add_column(col, overflow="ellipsis", no_wrap=True,
                                 ratio=1 if i == len(cols) - 1 else None)
            for cells in rows:
                table.add_row(*cells)
        return table


# The narrowest terminal that shows the use column: narrower, the last line keeps its room.
_USE_WIDTH = 100


class _Sized:
    """A renderable built for the width it is drawn in."""

    def __init__(self, build: Any) -> None:
        self.build = build

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield self.build(options.max_width)


def _some(line: str | None) -> list[str]:
    return [line] if line else []
