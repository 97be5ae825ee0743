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


def launch(plan, forks, playbook, progress_every):
    """The launch the schedule decides on, from the filter's arguments."""
    job = plan["job"]
    candidates = plan["nodes"] + plan.get("spares", [])
    return Launch(plan=plan, job=job, hosts=[node["host"] for node in plan["nodes"]],
                  master=plan["master"]["host"], forks=int(forks), playbook=playbook,
                  progress_every=float(progress_every or 0), detach=bool(job.get("detach")),
                  hang=int(job.get("hang_timeout") or 0) > 0,
                  slurm=frozenset(node["host"] for node in candidates if node.get("slurm_job")))


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
    ("forks_needed", forks_needed, None),
    ("forks_ok", forks_ok, None),
    ("barrier", barrier, "barrier"),
    ("gang", gang, None),
    ("firewall", firewall, "firewall"),
    ("start", start, "start"),
    ("spawn", spawn, "spawn"),
    ("watch", watch, "watch"),
    ("watch.round", watch_round, "round"),
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


# --- each node's part, once preflight has read it ------------------------------------------------
# What the launch's schedule leaves to a node's own facts: whether its job runs as root (its
# euid), whether its launcher was started ahead, what its start opened. Each is decided here, by
# the schedule's answer and that node's facts, never in a task file.


class Node(NamedTuple):
    """One node as the decisions below see it."""

    entry: dict  # the plan's entry of the node (torchherd_node)
    facts: dict  # preflight's facts of the node (torchherd_facts), empty before
    started: dict  # the start's answer on the node (torchherd_start), empty before


def node_firewall(s, n):
    """Who opens the node's rules: none where the plan gives it no firewall; the start, in its
    own round trip before the barrier, where the schedule lets it (firewall.start_opens) and the
    node's facts say the job runs as root (euid 0: no become to ask for); elsewhere the firewall
    role, before the start (under become where the node's firewall says so)."""
    if not (n.entry.get("firewall") or {}).get("enabled"):
        return "none", "the plan gives the node no firewall"
    if not s["firewall"]["start_opens"]:
        return "role", "the schedule has the firewall role open the rules before the start"
    if n.facts.get("euid") == 0:
        return "start", "the job runs as root here: the start opens the rules in its round trip"
    return "role", ("the job does not run as root here (euid "
                    f"{n.facts.get('euid', 'unknown')}): the firewall role opens the rules")


def node_start_ahead(s, n):
    """Preflight's facts call starts the node's launcher ahead where the schedule's start.warm
    holds, the node is one of the job's (a spare's turn is known only after preflight) and its
    launcher is spawned over ssh (under srun, a step of the node's SLURM job starts it)."""
    if not s["start"]["warm"]:
        return False, "the schedule starts no launcher ahead"
    if n.entry.get("node_rank") is None:
        return False, "a spare: whether it takes part is known only after preflight"
    spawn = s["spawn"].get(n.entry.get("host"), "ssh")
    if spawn != "ssh":
        return False, f"spawn {spawn}: the launcher starts as a step of the node's job"
    return True, "one of the job's nodes, spawned over ssh: its launcher starts in the facts call"


def node_warm(s, n):
    """The start hands the job to the launcher preflight started ahead on the node where one
    started there (its facts say so) and the node's launcher is spawned over ssh; under srun, a
    step of the node's SLURM job starts it anew."""
    started = bool((n.facts.get("warm") or {}).get("started"))
    spawn = s["spawn"].get(n.entry.get("host"), "ssh")
    if not started:
        return False, "no launcher was started ahead on the node"
    if spawn != "ssh":
        return False, f"spawn {spawn}: the launcher starts anew as a step of the node's job"
    return True, "the launcher started ahead on the node is handed the job"


def node_wait_closes(s, n):
    """A wait that sees the job end on the node removes the rules its start opened (the start's
    answer names them), with the firewall's own code: no teardown round trip for them."""
    rules = (n.started.get("firewall") or {}).get("rules") or []
    if rules:
        return True, f"the start opened {len(rules)} rule(s) here: the wait that sees the end removes them"
    return False, "the start opened no rule here"


# (the node schedule's entry, the decision). In the order they are made.
NODE_DECISIONS = (
    ("start_ahead", node_start_ahead),
    ("firewall", node_firewall),
    ("warm", node_warm),
    ("wait_closes", node_wait_closes),
)


def decide_node(s, n):
    """Each decision of NODE_DECISIONS for node ``n`` under schedule ``s``, with its reasons."""
    out, why = {}, {}
    for key, decision in NODE_DECISIONS:
        out[key], why[key] = decision(s, n)
    out["why"] = why
    return out
