# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Every decision of how a launch runs, one small function each, and the table that lists them
in the order they are made (DECISIONS).

A decision reads the launch (``c``: the plan, the forks, the playbook, the live view's wish)
and the decisions made before it (``s``: the schedule so far), and returns its value with the
reason it came out so (None where the value is a count, not a choice). Its docstring is the
rule; the reason is the rule applied to this launch."""

from __future__ import annotations

from typing import NamedTuple

from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS
from ansible_collections.torchherd.cluster.plugins.plugin_utils._plan.job import standby_mode

LINEAR = "ansible.builtin.linear"
FREE = "ansible.builtin.free"

# How long a standby's launcher waits after the barrier's go: torchrun's rendezvous takes the
# first nodes to join, and a standby that joined before a node of the job would leave that node
# waiting in its place (correct, but not the plan's). Importing torch takes seconds on a busy
# node; a standby loses nothing by waiting.
STANDBY_DELAY = 10.0

# How often, at most, the wait that speaks for the job returns with changed lines for a live
# view: with the nodes' own pace (a line a second, _gang) a line reaches the view in about 2 s.
LINES_EVERY = 1.0


class Launch(NamedTuple):
    """What the decisions are made from."""

    plan: dict
    job: dict
    hosts: list
    master: str
    forks: int
    playbook: str
    progress_every: float
    detach: bool
    hang: bool
    slurm: frozenset
    # The last launch of the same job on the same nodes whose gate passed (its run_id, and the
    # facts its preflight judged, by host), or None: see start_with_facts.
    prior: dict = None


def launch(plan, forks, playbook, progress_every, prior=None):
    """The launch the schedule decides on, from the filter's arguments."""
    job = plan["job"]
    candidates = plan["nodes"] + plan.get("spares", [])
    return Launch(plan=plan, job=job, hosts=[node["host"] for node in plan["nodes"]],
                  master=plan["master"]["host"], forks=int(forks), playbook=playbook,
                  progress_every=float(progress_every or 0), detach=bool(job.get("detach")),
                  hang=int(job.get("hang_timeout") or 0) > 0,
                  slurm=frozenset(node["host"] for node in candidates if node.get("slurm_job")),
                  prior=prior or None)


def playbook(c, s):
    """The playbook the schedule is for (launch or verify)."""
    return c.playbook, None


def nodes(c, s):
    """The number of nodes."""
    return len(c.hosts), None


def forks(c, s):
    """Ansible's forks for this run."""
    return c.forks, None


def all_at_once(c, s):
    """One task runs on every node at once where the forks are at least the nodes."""
    return c.forks >= len(c.hosts), None


def waves(c, s):
    """How many waves each task of the launch runs in: one where there is a worker per node,
    else the nodes over the forks (the caller's Ansible configuration set fewer; the driver
    gives one per node up to its bound where it sets none). The live view and the summary say
    so."""
    n, forks = len(c.hosts), max(1, int(c.forks or 1))
    count = -(-n // forks)
    if count <= 1:
        return 1, f"one worker per node ({forks} forks for {n} nodes)"
    return count, (f"{forks} forks for {n} nodes: each task runs in {count} waves (forks of the "
                   f"Ansible configuration; at least {n} runs every node at once)")


def forks_needed(c, s):
    """What of the run needs every node at once: verify's probe and interconnect check, the
    launch's interconnect check (interconnect always) and hang watch."""
    if c.playbook == "verify":
        return ["the master-port probe", "the interconnect check"], None
    needs = []
    if c.job.get("interconnect") == "always":
        needs.append("the interconnect check (interconnect always)")
    if c.hang:
        needs.append("the hang watch (hang_timeout)")
    return needs, None


def forks_ok(c, s):
    """The forks suffice where every node is at once, or nothing needs that."""
    return s["all_at_once"] or not s["forks_needed"], None


def barrier(c, s):
    """The start's barrier runs in the start's own call where every node can be in it at once,
    else in the nodes' supervisors. Turned off it is off only where the controller can watch
    every node at once: with fewer forks the supervisors still meet, because their meeting
    forms the gang, the only fail-fast that reaches every node then."""
    turned_on = c.plan.get("barrier", True)
    if not turned_on and s["all_at_once"]:
        return "none", "turned off (torchherd_torchrun_barrier false): no barrier, no gang"
    if s["all_at_once"]:
        return "start", "every node is in the start's call at once"
    return "supervisors", (
        f"fewer forks ({c.forks}) than nodes ({len(c.hosts)}): later nodes start while the "
        "first wait, so the supervisors meet"
        + ("; on although turned off, because the gang forms there and is the only fail-fast "
           "that reaches every node" if not turned_on else ""))


def gang(c, s):
    """The nodes' supervisors form the gang wherever the barrier runs."""
    return s["barrier"] != "none", None


def firewall(c, s):
    """The start opens the rules in its own round trip where the job runs as root, except where
    the interconnect check (or verify) needs them before the start; the supervisor closes
    them."""
    start_opens = c.job.get("interconnect") != "always" and c.playbook == "launch"
    if start_opens:
        why = ("the start opens the rules in its own round trip where the job runs as root "
               "(the firewall role elsewhere); the supervisor closes them")
    else:
        why = ("the firewall role opens the rules before the start: "
               + ("the interconnect check needs them" if c.playbook == "launch"
                  else "verify measures over them"))
    return {"start_opens": start_opens}, why


def _warm_off(c, module):
    """Why the launcher cannot start ahead, or None where it can."""
    if not c.plan.get("warm", True):
        return "turned off (torchherd_torchrun_warm false)"
    if c.playbook != "launch":
        return "verify starts no job"
    if not module:
        return f"the launcher {c.job.get('launcher')} starts anew"
    if c.plan.get("container"):
        return "the launcher runs in the job's image"
    if c.job.get("spawn") == "srun":
        return "srun starts the launcher"
    return None


def start(c, s):
    """Where the launcher allows it (a WARM_MODULE, on the node itself), each node's launcher
    starts ahead, in preflight's facts call, and imports it while the launch goes on; the start
    hands it the job. It waits up to its deadline, a minute and a second per node (the forks'
    batches and the sync come between)."""
    module = LAUNCHERS[c.job.get("launcher") or "torchrun"].WARM_MODULE
    off = _warm_off(c, module)
    value = {"warm": off is None, "module": module if off is None else None,
             "deadline": 60.0 + len(c.hosts)}
    if off is not None:
        return value, f"the launcher starts with the start: {off}"
    return value, (
        f"each node's launcher starts in preflight's facts call and imports {module} while the "
        f"launch goes on; the start hands it the job (where none waits, or under srun, it "
        f"starts anew); unclaimed, it ends after {value['deadline']:g} s")


def _with_facts_off(c, s):
    """Why a node's start cannot come with its facts call, or None where it can."""
    if c.playbook != "launch":
        return "verify starts no job"
    if c.plan.get("restart"):
        return "a restart of the run"
    if not c.prior:
        return "no earlier launch of this job on these nodes whose preflight passed"
    if s["barrier"] != "start":
        return ("the barrier is not in the start's call, where a node that refuses calls the "
                "start off on every node")
    if c.plan.get("spares"):
        return "spares: preflight chooses the job's nodes"
    if c.plan.get("venv") or c.plan.get("container"):
        return "the facts call makes the job's venv or finds its image first"
    if any(s["spawn"][h] != "ssh" for h in c.hosts):
        return "srun starts the launcher"
    if c.job.get("interconnect") == "always":
        return "the interconnect check comes between the facts and the start"
    facts = c.prior.get("facts") or {}
    for node in c.plan["nodes"]:
        if (node.get("firewall") or {}).get("enabled") and (
                not s["firewall"]["start_opens"]
                or (facts.get(node["host"]) or {}).get("euid") != 0):
            return f"the firewall role opens {node['host']}'s rules before the start"
    return None


def start_with_facts(c, s):
    """On a relaunch of the same job (the same plan but its run id, and the same code) on the
    same nodes, whose last launch's preflight passed, each node's start comes with its facts
    call: one module call per node fewer. The controller computes every start from that
    preflight's verdict; a node goes on only where its fresh facts are the ones judged then
    (node_facts' start_expect), else it refuses at the barrier, which calls the start off on
    every node, and the launch takes the full path (the gate on the fresh facts, the sync, the
    start). Only where nothing must come between the facts and the start: the barrier in the
    start's call, no spares, no venv or image to make ready, ssh, no interconnect check, and
    every node's rules opened by its start (or none)."""
    off = _with_facts_off(c, s)
    if off is not None:
        return False, f"the start follows the facts call: {off}"
    return True, (f"a relaunch of run {c.prior.get('run_id')}'s job on the same nodes: each "
                  "node's start comes with its facts call and goes on only where the facts are "
                  "the ones that launch's preflight judged; a node that refuses calls the start "
                  "off everywhere and the launch takes the full path")


def sample_every(c, s):
    """Each node's supervisor samples the node's GPUs (nvidia-smi's query, no CUDA context), CPU
    and memory at the job's sample_interval into the node's run record while the job runs,
    detached or not (the live view, status and the summary read them there); 0 turns it off."""
    every = float(c.job.get("sample_interval", 5) or 0)
    if every <= 0:
        return 0.0, "the job's sample_interval is 0: the nodes' use is not sampled"
    return every, (f"every {every:g} s each node's supervisor samples its GPUs, CPU and memory "
                   "into its run record while the job runs (the job's sample_interval)")


def spawn(c, s):
    """How each node's launcher is started, by host (the plan's nodes and spares): ssh, the
    supervisor runs it itself; srun, as a step of the node's SLURM job, which SLURM accounts
    for and scancel ends. The job's spawn auto is srun on the nodes of a SLURM job (the plan's
    slurm_job of a node: its torchherd_slurm_job_id, from the torchherd.cluster.slurm
    inventory), ssh elsewhere."""
    wanted = c.job.get("spawn", "auto")
    hosts = [node["host"] for node in c.plan["nodes"] + c.plan.get("spares", [])]
    value = {h: "srun" if wanted == "srun" or (wanted == "auto" and h in c.slurm) else "ssh"
             for h in hosts}
    if wanted != "auto":
        return value, f"the job's spawn {wanted}"
    return value, ("spawn auto: srun on the nodes of a SLURM job ("
                   + (", ".join(h for h in hosts if h in c.slurm) or "none") + "), ssh elsewhere")


def _free(c, s):
    """The free strategy, every node waiting on its own job, where the controller must act on
    one node's word at once: no gang to stop the others, or the hang watch (the node that
    declares the hang reads every rank's stack right then)."""
    return c.hang or not s["gang"]


def _master_alone(c, s):
    """verify starts no job; a job started on its plan (the roles on their own) is watched on
    every node."""
    static = c.job.get("rdzv", "static") == "static"
    return c.playbook == "launch" and (
        (not s["all_at_once"]) or (not _free(c, s) and static and not c.detach))


def _watch_why(c, s, alone):
    if c.playbook == "verify":
        return "verify starts no job: a job started on its plan is watched on every node"
    if not s["all_at_once"]:
        return ("fewer forks than nodes: a wait in flight on every node would queue the others "
                "for the whole job; the master's gang speaks for every node")
    if alone:
        return "the nodes form the gang and the job is static: the master speaks for all"
    if not s["gang"]:
        return "no gang: every node waits on its own job, a failure stops every node"
    if c.hang:
        return "the hang watch: every node watches its own ranks' activity"
    if c.detach:
        return "detached: every node is looked at once"
    return "elastic: the job goes on without lost nodes, the master's among them"


def watch(c, s):
    """Where the nodes form the gang and the job is static and watched, the watch waits on the
    master alone (its gang speaks for every node), and on every node where the gang turns out
    incomplete. Without the gang, with the hang watch or an elastic rendezvous, every node is
    watched under the free strategy. Under the linear strategy every wait has returned when a
    rescue runs: the gang ended the job everywhere, one node's stop is the check that nothing
    runs."""
    alone = _master_alone(c, s)
    free = _free(c, s)
    several = len(c.hosts) > 1
    return {"hosts": [c.master] if alone else c.hosts,
            "master_alone": alone and several,
            "strategy": FREE if free else LINEAR,
            "stops_all": free,
            "once": c.detach,
            "if_gang_incomplete": "watch_every_node" if alone and several else "nothing",
            }, _watch_why(c, s, alone)


def watch_round(c, s):
    """A wait lasts the job's watch_interval, shorter for a live view where one wait speaks for
    the job (a round on every node costs the controller a task per node); a detached launch
    looks once."""
    interval = float(c.job.get("watch_interval") or 0)
    live = c.progress_every
    if c.detach:
        return 0, "detached: the watch looks once"
    if live > 0 and len(s["watch"]["hosts"]) == 1 and not c.hang and interval > live:
        return live, (f"a live view asked for word every {live:g} s, and one wait speaks for "
                      "the job: one task per round")
    return interval, "the job's watch_interval" + (
        " (a live view's rounds on every node would cost a task per node each)"
        if live > 0 and interval > live else "")


def watch_lines(c, s):
    """Where a live view asked for word (progress_every) and one wait speaks for the job (the
    master's for its gang, or a single node's), that wait also returns as soon as a node's last
    line of the job changed, at most once a second (or at the view's own interval, where
    shorter): each node says its line to the master at most once a second (_gang), so a line
    is a second or two old in the view. Where every node is watched, or the job is detached,
    the lines come with the rounds."""
    live = c.progress_every
    if live <= 0:
        return 0.0, "no live view asked for word: the lines come with the rounds"
    if c.detach:
        return 0.0, "detached: the watch looks once"
    if len(s["watch"]["hosts"]) != 1:
        return 0.0, ("every node is watched: a wait returning for its lines would cost a task "
                     "per node each time; the lines come with the rounds")
    every = min(live, LINES_EVERY)
    whose = "every node's, as the master's gang hands them on" if s["watch"]["master_alone"] \
        else "the node's"
    return every, (f"a live view asked for word and one wait speaks for the job: it also returns "
                   f"when a last line changed ({whose}), at most every {every:g} s")


def watch_hang(c, s):
    """Each wait also runs the hang watch (it returns when its node goes quiet or active again)
    where the job has a hang_timeout and is watched beyond its first look."""
    if not c.hang:
        return False, "no hang_timeout: the waits watch the job's state alone"
    if c.detach:
        return False, "detached: the watch looks once, the hang watch has nothing to follow"
    return True, (f"hang_timeout {c.job.get('hang_timeout')}: every wait also follows its "
                  "node's activity, and the job is hung once every node is quiet")


def watch_lost_fails(c, s):
    """A node lost over SSH fails the watch (and stops the gang), except in an elastic
    rendezvous, where torchrun re-forms the group from the nodes left and fails by itself when
    too few are."""
    if c.job.get("rdzv", "static") == "static":
        return True, "static: a lost node's ranks are gone for good, the job is stopped"
    return False, ("elastic: torchrun re-forms the group from the nodes left, and fails by "
                   "itself when too few are")


def teardown(c, s):
    """The teardown visits the nodes whose rules are still in place after the watch; a detached
    launch keeps its rules until stop or collect."""
    if c.detach:
        return "none", "detached: the rules stay until stop or collect of the run id"
    return "nodes_with_rules", "the nodes whose rules are still in place after the watch"


def _restart_why(c, value, allowed):
    if c.playbook != "launch":
        return "verify starts no job"
    if value["by"] == "torchrun":
        standbys = value["standbys"]
        return (f"detached with restarts {allowed}: torchrun restarts the workers on every node "
                f"after any failure (its --max-restarts), without a controller; its rendezvous "
                f"takes in a standby for a lost node ("
                + (", ".join(standbys) + f", started {STANDBY_DELAY:g} s after the others"
                   if standbys else "none: the job goes on with fewer nodes where "
                   "min_node_count allows") + "); the master node hosts the rendezvous and "
                "cannot be lost")
    if c.detach:
        return "detached: nothing watches the job to see it fail"
    if not allowed:
        return "the job allows no restart (restarts 0)"
    if value["left"]:
        return (f"restart {value['this']} of {allowed}: a failure of a kind in restart_on "
                f"({', '.join(value['on']) or 'none left'}) launches the run again without the "
                "failed node")
    return f"restart {value['this']} of {allowed}: the restarts are spent"


def restart(c, s):
    """Whole-job restarts, which the driver acts on after a failed launch: the driver's where
    the watch sees the failure, torchrun's own (its elastic rendezvous, with the plan's
    standbys) for a detached job that allows restarts, none for verify."""
    allowed = int(c.job.get("restarts") or 0)
    this = int(c.plan.get("restart") or 0)
    left = 0 if c.detach or c.playbook != "launch" else max(0, allowed - this)
    on_nodes = standby_mode(c.job) and c.playbook == "launch"
    standbys = [node["host"] for node in c.plan["nodes"] if node.get("standby")]
    value = {"this": this, "left": left,
             "on": list(c.job.get("restart_on") or []) if left or on_nodes else [],
             "excluded": dict(c.plan.get("excluded") or {}),
             "by": "torchrun" if on_nodes else "driver" if left else "none",
             "launcher": allowed if on_nodes else int(c.job.get("max_restarts") or 0),
             "standbys": standbys if on_nodes else [],
             "standby_delay": STANDBY_DELAY if on_nodes and standbys else 0.0}
    return value, _restart_why(c, value, allowed)


def venv(c, s):
    """The job's locked venv is made, or found, in preflight's facts call, before each node's
    Python is read; an unchanged lock costs a file check."""
    if not c.plan.get("venv"):
        return "none", "no lock: the job runs each node's own Python"
    return "facts", (f"the job's lock {(c.job.get('venv') or {}).get('lock')}: each node makes "
                     "its venv, or finds the one the same lock made, in preflight's facts call, "
                     "before its Python is read; an unchanged lock costs a file check")


def container(c, s):
    """The job's image is found, or pulled, in preflight's facts call; the launcher runs in
    it."""
    image = c.plan.get("container") or {}
    if not image:
        return "none", "no image: the launcher runs on each node itself"
    return "image", (
        f"the job's image {image.get('image')}: each node finds its {image.get('runtime')} "
        f"runtime and the image (pull {image.get('pull')}) in preflight's facts call, which "
        "reads torch inside it (cached while the image's id is the same); the start runs the "
        "launcher in it")


# (the schedule's entry, a dotted name for one inside a section; the decision; the `why` entry
# its reason goes to, or None). In the order they are made: a decision reads those above it.
DECISIONS = (
    ("playbook", playbook, None),
    ("nodes", nodes, None),
    ("forks", forks, None),
    ("all_at_once", all_at_once, None),
    ("waves", waves, "waves"),
    ("forks_needed", forks_needed, None),
    ("forks_ok", forks_ok, None),
    ("barrier", barrier, "barrier"),
    ("gang", gang, None),
    ("firewall", firewall, "firewall"),
    ("start", start, "start"),
    ("start.sample_every", sample_every, "sample"),
    ("spawn", spawn, "spawn"),
    ("start.with_facts", start_with_facts, "with_facts"),
    ("watch", watch, "watch"),
    ("watch.round", watch_round, "round"),
    ("watch.lines", watch_lines, "lines"),
    ("watch.hang", watch_hang, "hang"),
    ("watch.lost_fails", watch_lost_fails, "lost_fails"),
    ("teardown", teardown, "teardown"),
    ("restart", restart, "restart"),
    ("venv", venv, "venv"),
    ("container", container, "container"),
)


def decide(c):
    """The schedule of launch ``c``: every decision of DECISIONS, with its reasons (``why``)."""
    s, why = {}, {}
    for key, decision, why_key in DECISIONS:
        value, reason = decision(c, s)
        section, entry = key.rpartition(".")[::2]
        (s[section] if section else s)[entry] = value
        if why_key:
            why[why_key] = reason
    s["why"] = why
    return s
