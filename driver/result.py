"""What a run came to: exit codes, per-host results, and the verdict read from the run directory.

The playbooks write ``runs/<run_id>/plan.json``, ``preflight.json`` and ``summary.json``; the
driver only reads them. ``verdict`` is pure, so the mapping to exit codes is unit-tested.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any, TypedDict, cast

from driver.logs import static_nproc

# The driver's own note in a run directory: the inventory of the launch, and how a cancelled
# launch ended (state, reason) where no summary can say it.
DRIVER_FILE = "driver.json"


class Exit(IntEnum):
    """Exit codes of the CLI, also ``RunResult.exit_code``."""

    OK = 0
    ERROR = 1
    USAGE = 2
    PREFLIGHT_FAILED = 3
    JOB_FAILED = 4
    NODE_UNREACHABLE = 5
    TIMEOUT = 6
    HUNG = 7
    CANCELLED = 130


class UsageError(ValueError):
    """A request that cannot run at all (bad job spec, unknown run id): exit code 2."""


class HostResult(TypedDict, total=False):
    """One node of a run, as summary.json records it (plus the artifacts fetched back)."""

    node_rank: int
    address: str
    nproc_per_node: int | None  # processes on this node, as preflight resolved them
    interface: dict[str, str] | None  # name, address, how: the job's traffic's interface
    # running succeeded failed stopped timed_out standby lost unreachable absent unknown
    state: str
    standby: bool  # started to wait in torchrun's rendezvous for a lost node (detached restarts)
    exit_code: int | None
    unreachable: bool
    error: str | None
    last_line: str
    started_at: float | None
    ended_at: float | None
    first_output_at: float | None  # when a rank of the node first wrote output
    # Where torchrun restarts the workers itself: when each attempt started here and when its
    # ranks first wrote output (attempt number to started_at, output_at), and whether a
    # standby took part (null while it runs).
    attempts: dict[str, dict[str, float | None]]
    standby_used: bool | None
    lost_at: float | None  # when the master's gang saw the node's link close (a lost node)
    clock_offset: float | None  # seconds the node's clock is ahead of the controller's
    log: str | None  # runs/<run_id>/nodes/<host>/node.log on the controller
    logs_fetched: bool
    failing_rank: int | None
    exception: str | None
    traceback: str | None
    artifacts: list[str]  # files under runs/<run_id>/artifacts/<host>/
    sync: dict[str, int] | None  # files and bytes the launch's sync sent to this node
    # The node's GPUs, CPU and memory while the job ran (the schedule's start.sample_every):
    # stats (per GPU mean_util and peak_memory_mib, mean_cpu, peak_memory_mib), recent (the
    # last samples as taken: [time, samples, cpu %, memory MiB, [[util %, memory MiB], ...]]),
    # gpus, every; None where nothing was sampled.
    use: dict[str, Any] | None


class NodeFacts(TypedDict, total=False):
    """One node as verify found it (preflight.json: the node's facts and the gate's verdict)."""

    node_rank: int | None
    role: str  # master or worker
    hostname: str | None
    check: str  # passed failed unreachable unchecked
    failed_checks: list[str]  # the checks that named this node
    python: str | None  # version of the job's interpreter
    python_path: str | None
    # The job's locked venv (job key venv): path, made (this launch made it, else reused),
    # seconds spent on it, packages (as uv pip freeze lists them); None without one.
    venv: dict[str, Any] | None
    # The job's image (job key container): runtime, image, id, pulled (by this launch), seconds
    # (finding and pulling it), error; None without one.
    container: dict[str, Any] | None
    torch: str | None
    cuda: str | None
    nccl: str | None
    # name, memory_bytes of each GPU torch sees, nics nearest to it and link (PIX ... SYS)
    gpus: list[dict[str, Any]]
    nproc_per_node: int | None
    launchers: dict[str, str | None]  # launchers torch does not bring: version, or None
    interface: dict[str, Any] | None  # name, address, how: the job's traffic's interface
    disk_free_bytes: int | None  # free under the node's torchherd root
    shm_bytes: int | None  # the size of /dev/shm
    rdma: list[str]  # InfiniBand/RoCE ports, "mlx5_0:1 ACTIVE"
    warned_checks: list[str]  # the warnings that named this node (the job may start)
    error: str | None  # why the interpreter or torch could not be read


@dataclass
class RunResult:
    """One run as the last playbook left it: verdict, per-host results, timings."""

    run_id: str
    run_dir: Path
    action: str
    state: str
    exit_code: Exit
    reason: str
    # verify: what preflight found on each node (NodeFacts); else summary.json's hosts.
    hosts: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    problems: list[dict[str, str]] = field(default_factory=list)
    warnings: list[dict[str, str]] = field(default_factory=list)  # preflight's, the job started
    # The nodes preflight left out where the inventory held spares, and why.
    left_out: dict[str, str] = field(default_factory=dict)
    # Whole-job restarts after failures (the job's restarts): when, which node, why, what
    # replaced it, seconds from the failure to the restarted job's first output.
    incidents: list[dict[str, Any]] = field(default_factory=list)
    world_size: int | None = None
    nproc_per_node: int | str | None = None  # 'auto' until preflight resolved it
    nnodes: str | None = None  # "3", or MIN:MAX for elastic rendezvous
    master: dict[str, Any] | None = None  # host, addr, port
    merged_log: str | None = None  # every node's log, lines prefixed with host and rank
    sync: dict[str, int] | None = None  # files, bytes, nodes_sent_to: what the sync sent
    # Processes per node when global ranks follow node ranks (static rendezvous), else None.
    static_nproc: int | None = None
    # The interconnect check's verdict and a declared hang (summary.json), and with stacks the
    # report it wrote (stacks/<time>.json).
    interconnect: dict[str, Any] | None = None
    hang: dict[str, Any] | None = None
    stacks: dict[str, Any] | None = None
    # The nodes whose GPUs sat idle while the others' worked: host to its longest such spell
    # in seconds (summary.json; the nodes' use is in each host's `use`).
    idle_gpus: dict[str, float] = field(default_factory=dict)
    # Where the launch had fewer Ansible forks than nodes: how many waves each task ran in, and
    # the schedule's why (schedule.json); 1 where every node ran at once.
    waves: int | None = None
    waves_why: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == Exit.OK

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document (driver/schema.json)."""
        return {
            "action": self.action, "run_id": self.run_id, "run_dir": str(self.run_dir),
            "state": self.state, "exit_code": int(self.exit_code),
            "exit_name": self.exit_code.name.lower(), "reason": self.reason,
            "world_size": self.world_size, "nproc_per_node": self.nproc_per_node,
            "nnodes": self.nnodes, "master": self.master, "merged_log": self.merged_log,
            "hosts": self.hosts, "timings": self.timings, "sync": self.sync,
            "problems": self.problems, "warnings": self.warnings, "left_out": self.left_out,
            "incidents": self.incidents,
            "interconnect": self.interconnect, "hang": self.hang,
            "stacks": self.stacks, "idle_gpus": self.idle_gpus, "waves": self.waves,
        }


def usage_document(action: str | None, reason: str) -> dict[str, Any]:
    """The ``--json`` document of a request refused before any run (driver/schema.json,
    usage): the verdict keys of a run's document, without a run."""
    return {"action": action, "state": "invalid", "exit_code": int(Exit.USAGE),
            "exit_name": Exit.USAGE.name.lower(), "reason": reason}


@dataclass
class RunInfo:
    """A past run, as ``runs()`` lists it from the runs directory."""

    run_id: str
    run_dir: Path
    state: str
    started_at: float | None
    nodes: list[str]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "run_dir": str(self.run_dir), "state": self.state,
                "started_at": self.started_at, "nodes": self.nodes, "reason": self.reason}


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def exit_for_hosts(state: str, hosts: dict[str, Any], action: str) -> Exit:
    """The exit code a summary means. Its overall state has the last word on success (an
    elastic job may finish without a lost node). Otherwise a lost node explains the failures
    it causes elsewhere, so it ranks first; a timeout stops every node, so it ranks before
    plain failures."""
    if state == "hung":
        return Exit.HUNG
    if state in ("succeeded", "running"):
        return Exit.OK
    states = {h.get("state") for h in hosts.values()}
    if states & {"lost", "unreachable"}:
        return Exit.NODE_UNREACHABLE
    if "timed_out" in states:
        return Exit.TIMEOUT
    if "failed" in states or state == "failed":
        return Exit.JOB_FAILED
    if state == "stopped":
        # Stopping is what stop (and a status afterwards) is for; a launch that was stopped
        # from elsewhere did not do its job.
        return Exit.JOB_FAILED if action == "launch" else Exit.OK
    return Exit.ERROR


def _preflight_verdict(gate: dict[str, Any]) -> tuple[Exit, str, str]:
    problems = gate.get("problems") or []
    code = Exit.NODE_UNREACHABLE if any(p.get("check") == "ssh" for p in problems) \
        else Exit.PREFLIGHT_FAILED
    reason = "; ".join(f"{p['host']}: {p['check']}: expected {p['expected']}, found "
                       f"{p['found']}" for p in problems) or "preflight failed"
    return code, "preflight_failed", reason


def verdict(
    action: str,
    summary: dict[str, Any] | None,
    preflight: dict[str, Any] | None,
    planned: bool,
    rc: int,
    message: str,
) -> tuple[Exit, str, str]:
    """Exit code, state and reason of an action, from the run's files and the runner's rc.

    ``planned``: plan.json exists (without it, Ansible refused the input: a usage error).
    ``message``: the first failure Ansible reported, for when the files say nothing.
    """
    gate = (preflight or {}).get("gate") or {}
    if summary and summary.get("state") not in (None, "unknown"):
        state, reason = summary["state"], summary.get("reason", "")
        hosts = summary.get("hosts") or {}
        code = exit_for_hosts(state, hosts, action)
        # Ansible's rc counts an unreachable host as a failure; an elastic job that finished
        # without its lost node succeeded all the same.
        lost = any(h.get("state") in ("lost", "unreachable") for h in hosts.values())
        if code == Exit.OK and rc != 0 and not lost:
            return Exit.ERROR, state, message
        return code, state, reason
    if gate and not gate.get("ok", True):
        return _preflight_verdict(gate)
    if action == "verify" and rc == 0 and gate.get("ok"):
        return Exit.OK, "verified", "every check passed"
    if not planned:
        return Exit.USAGE, "invalid", message
    if summary:
        return Exit.ERROR, summary["state"], summary.get("reason", message)
    return Exit.ERROR, "error", message


def node_facts(plan: dict[str, Any], preflight: dict[str, Any] | None) -> dict[str, NodeFacts]:
    """Every planned node (in node_rank order) as preflight found it: its facts, and whether
    the checks passed there. A check that compares nodes names all of them ("a, b")."""
    facts = (preflight or {}).get("facts") or {}
    gate = (preflight or {}).get("gate") or {}
    master = (plan.get("master") or {}).get("host")
    named: dict[str, list[str]] = {}
    for problem in gate.get("problems") or []:
        for host in str(problem.get("host", "")).split(", "):
            named.setdefault(host, []).append(str(problem.get("check", "")))
    warned: dict[str, list[str]] = {}
    for warning in gate.get("warnings") or []:
        for host in str(warning.get("host", "")).split(", "):
            warned.setdefault(host, []).append(str(warning.get("check", "")))
    nodes: dict[str, NodeFacts] = {}
    for node in plan.get("nodes") or []:
        host = node["host"]
        found = facts.get(host) or {}
        python = found.get("python") or {}
        torch = found.get("torch") or {}
        checks = named.get(host, [])
        if "ssh" in checks:
            check = "unreachable"
        elif checks:
            check = "failed"
        elif found and gate:
            check = "passed"
        else:
            check = "unchecked"
        nproc = (gate.get("nprocs") or {}).get(host)
        nodes[host] = {
            "node_rank": node.get("node_rank"),
            "role": "master" if host == master else "worker",
            "hostname": found.get("hostname"), "check": check, "failed_checks": checks,
            "python": python.get("version"), "python_path": python.get("executable"),
            "venv": ({k: found["venv"].get(k) for k in ("path", "made", "seconds", "packages")}
                     if found.get("venv") else None),
            "container": ({k: found["container"].get(k) for k in
                           ("runtime", "image", "id", "pulled", "seconds", "error")}
                          if found.get("container") else None),
            "torch": torch.get("version"), "cuda": torch.get("cuda"),
            "nccl": torch.get("nccl"),
            "gpus": [_gpu(g, found.get("gpu_nics") or {}) for g in torch.get("gpus") or []],
            "nproc_per_node": nproc if isinstance(nproc, int) else None,
            "launchers": dict(torch.get("launchers") or {}),
            "interface": (gate.get("interfaces") or {}).get(host) or _interface(found),
            "disk_free_bytes": found.get("disk_free_bytes"),
            "shm_bytes": found.get("shm_bytes"),
            "rdma": [f"{device}:{port} {(info or {}).get('state') or '?'}"
                     for device, ports in sorted((found.get("infiniband") or {}).items())
                     for port, info in sorted((ports or {}).items())],
            "warned_checks": warned.get(host, []),
            "error": python.get("error") or torch.get("error")}
    return nodes


# How near a NIC is to a GPU on the PCI tree, nearest first (node_facts' gpu_nics).
LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")


def _gpu(gpu: dict[str, Any], gpu_nics: dict[str, Any]) -> dict[str, Any]:
    """One GPU of verify's facts: name, memory, and the InfiniBand/RoCE devices nearest to it
    on the PCI tree with how near (nvidia-smi topo's words), where the node has any."""
    links = gpu_nics.get(str(gpu.get("uuid") or "").removeprefix("GPU-")) or {}
    known = {nic: how for nic, how in links.items() if how in LINKS}
    link = min(known.values(), key=LINKS.index) if known else None
    nics = sorted(nic for nic, how in known.items() if how == link)
    return {"name": gpu.get("name"), "memory_bytes": gpu.get("memory_bytes"),
            "nics": nics, "link": link}


def _interface(found: dict[str, Any]) -> dict[str, Any] | None:
    chosen = found.get("interface") or {}
    return {k: chosen.get(k) for k in ("name", "address", "how")} if chosen.get("name") \
        else None


def cancel_verdict(summary: dict[str, Any] | None, stopped: bool,
                   stop_hint: str) -> tuple[str, str]:
    """State and reason of a launch cancelled by its caller, from the summary that the stop
    (``stopped``) or, for on_interrupt detach, the status after the cancel wrote. A job that
    no node had started is ``cancelled``, not stopped: the stop found nothing to stop."""
    hosts = (summary or {}).get("hosts") or {}
    states = {host: entry.get("state") for host, entry in hosts.items()}
    overall = (summary or {}).get("state")
    known = overall if overall not in (None, "unknown") else "cancelled"
    if not states:
        return "cancelled", (f"cancelled; the job's state on the nodes is not known (no answer "
                             f"was recorded); check it with status, or stop it: {stop_hint}")
    if all(state == "absent" for state in states.values()):
        return "cancelled", ("cancelled before the job started: nothing was started on any "
                             "node")
    left = [f"{host} ({state})" for host, state in states.items()
            if state in ("running", "unreachable", "lost")]
    if left:
        return known, (f"cancelled; the job may still run on {', '.join(left)}; stop it with: "
                       f"{stop_hint}")
    if not stopped:
        return known, f"cancelled; the job had already ended: {known}"
    where = " where it had started" if "absent" in states.values() else ""
    return known, f"cancelled; the job was stopped on every node{where}"


def artifacts_of(run_dir: Path, host: str) -> list[str]:
    base = run_dir / "artifacts" / host
    return sorted(str(p) for p in base.rglob("*") if p.is_file()) if base.is_dir() else []


def read_result(run_dir: Path, action: str, rc: int, message: str) -> RunResult:
    """The RunResult that the run directory and the runner's return code amount to."""
    summary = read_json(run_dir / "summary.json")
    preflight = read_json(run_dir / "preflight.json")
    code, state, reason = verdict(action, summary, preflight,
                                  (run_dir / "plan.json").exists(), rc, message)
    hosts: dict[str, Any] = {}
    for host, entry in ((summary or {}).get("hosts") or {}).items():
        hosts[host] = cast(HostResult, {**entry, "artifacts": artifacts_of(run_dir, host)})
    gate = (preflight or {}).get("gate") or {}
    plan = read_json(run_dir / "plan.json") or {}
    schedule = read_json(run_dir / "schedule.json") or {}
    if action == "verify":
        hosts = dict(node_facts(plan, preflight))
    # The gate resolved nproc_per_node 'auto' (a summary written by status, stop or collect
    # may still say 'auto'); before any summary, the plan has the rest.
    layout = {**plan, **(summary or {}),
              **{k: v for k, v in gate.items()
                 if k in ("world_size", "nproc_per_node") and isinstance(v, int)}}
    # So did a master port of auto (a verify writes no summary).
    if layout.get("master") and isinstance(gate.get("master_port"), int):
        layout["master"] = {**layout["master"], "port": gate["master_port"]}
    return RunResult(run_id=run_dir.name, run_dir=run_dir, action=action, state=state,
                     exit_code=code, reason=reason, hosts=hosts,
                     timings=(summary or {}).get("timings") or {}, summary=summary or {},
                     problems=list(gate.get("problems") or []),
                     warnings=list(gate.get("warnings") or []),
                     left_out=dict((preflight or {}).get("left_out") or {}),
                     incidents=list((summary or {}).get("incidents") or []),
                     world_size=layout.get("world_size"),
                     nproc_per_node=layout.get("nproc_per_node"),
                     nnodes=layout.get("nnodes"), master=layout.get("master"),
                     merged_log=(summary or {}).get("merged_log"),
                     sync=(summary or {}).get("sync"),
                     static_nproc=static_nproc(plan, preflight),
                     interconnect=(summary or {}).get("interconnect")
                     or _interconnect_of(gate),
                     hang=(summary or {}).get("hang"),
                     idle_gpus=dict((summary or {}).get("idle_gpus") or {}),
                     waves=schedule.get("waves"),
                     waves_why=(schedule.get("why") or {}).get("waves"),
                     stacks=newest_stacks(run_dir) if action == "stacks" else None)


def _interconnect_of(gate: dict[str, Any]) -> dict[str, Any] | None:
    """The gate's interconnect verdict without every node's raw result (verify has no summary)."""
    found = gate.get("interconnect")
    return {k: v for k, v in found.items() if k != "results"} if found else None


def newest_stacks(run_dir: Path) -> dict[str, Any] | None:
    """The newest stacks report of a run (stacks/<time>.json) and its files."""
    reports = sorted((run_dir / "stacks").glob("*.json"))
    if not reports:
        return None
    report = read_json(reports[-1]) or {}
    return {"summary": report.get("summary"), "groups": report.get("groups") or [],
            "odd": report.get("odd") or [], "errors": report.get("errors") or {},
            "problems": report.get("problems") or [],
            "flight_recorder": report.get("flight_recorder") or {},
            "nccl_ras": report.get("nccl_ras") or {},
            "ranks": [{k: v for k, v in r.items() if k != "threads"}
                      for r in report.get("ranks") or []],
            "json": str(reports[-1]), "text": str(reports[-1].with_suffix(".txt"))}


def _said(problem: dict[str, Any]) -> str:
    """One problem of a stacks report: the nodes that met it, what they met and its fix."""
    fix = f"; fix: {problem['fix']}" if problem.get("fix") else ""
    return f"{', '.join(problem['hosts'])}: {problem['error']}{fix}"


def stacks_verdict(stacks: dict[str, Any] | None) -> tuple[Exit, str] | None:
    """Why a stacks action did not read what it was asked for (exit code, reason naming each
    node and what it lacked), or None when every node answered and the stack of a rank found
    was read. (No rank found at all, e.g. before torchrun started its workers, is no failure:
    the report says so.)"""
    if not stacks:
        return Exit.ERROR, "stacks: expected a report in the run's stacks/, found none written"
    # Each error once with the nodes (and ranks) that met it, and its fix once.
    errors = stacks.get("errors") or {}
    problems = stacks.get("problems") or [
        {"hosts": [host], "ranks": [], "error": error, "fix": None}
        for host, error in errors.items()]
    if errors:
        return Exit.ERROR, "; ".join(_said(p) for p in problems if not p.get("ranks"))
    if stacks.get("ranks") and not stacks.get("groups"):
        fixes = dict.fromkeys(p["fix"] for p in problems if p.get("fix"))
        return Exit.ERROR, "; ".join([f"stacks: {stacks.get('summary') or 'no stack read'}"]
                                     + [f"fix: {fix}" for fix in fixes])
    return None


def run_info(run_dir: Path) -> RunInfo | None:
    """What runs() shows of one run directory; None when it holds no plan."""
    plan = read_json(run_dir / "plan.json")
    if plan is None:
        return None
    summary = read_json(run_dir / "summary.json")
    gate = (read_json(run_dir / "preflight.json") or {}).get("gate") or {}
    # A cancelled launch's own verdict (the driver's note, driver.outcomes) where the summary
    # has none.
    note = read_json(run_dir / DRIVER_FILE) or {}
    cancelled = note.get("cancelled") or {}
    # A verify writes no summary, nor does a launch that ended before it: their verdicts are
    # the driver's note too.
    verified = note.get("verify") or note.get("launch") or {}
    if cancelled and (summary or {}).get("state") in (None, "unknown"):
        state, reason = cancelled.get("state", "cancelled"), cancelled.get("reason", "")
    elif summary:
        state, reason = summary.get("state", "unknown"), summary.get("reason", "")
    elif verified:
        state, reason = verified.get("state", "unknown"), verified.get("reason", "")
    elif gate and not gate.get("ok", True):
        _code, state, reason = _preflight_verdict(gate)
    else:
        state, reason = "unknown", "no summary.json (a launch in progress, or one interrupted)"
    return RunInfo(run_id=run_dir.name, run_dir=run_dir, state=state,
                   started_at=plan.get("started_at"),
                   nodes=[n["host"] for n in plan.get("nodes") or []], reason=reason)
