# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The launch's schedule: every decision of how a launch runs, made once, from the plan and the
settings. The plays and roles read it (torchherd_schedule); none of them decides again."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS

DOCUMENTATION = r"""
name: schedule
author: torchherd developers
version_added: 0.1.0
short_description: Decide how a launch runs (batching, barrier, firewall, gang, watch, teardown)
description:
  - A pure function of the plan (C(torchherd.cluster.plan), which carries the start barrier's
    setting), the playbook and the number of Ansible forks. Computed once per run by the plan role, written to
    the run directory as C(schedule.json), and read by the plays and roles of the launch.
  - C(all_at_once) says whether one task can run on every node at once (forks at least the
    number of nodes). Some steps need that (verify's probe, the interconnect check, the hang
    watch); C(forks_needed) names them, and C(forks_ok) is false where they cannot have it.
  - The start's barrier runs in the start's own call where every node can be in it at once,
    else in the nodes' supervisors (C(supervisors)). Turned off (the plan's C(barrier) false) it is off only
    where the controller can watch every node at once; with fewer forks the supervisors still
    meet, because their meeting forms the gang, the only fail-fast that reaches every node then.
  - Where the nodes form the gang and the job is static and watched, the watch waits on the
    master alone (its gang speaks for every node); where the gang turns out incomplete, every
    node is watched on its own (C(watch.if_gang_incomplete)). Without the gang, with the hang
    watch or an elastic rendezvous, every node is watched under the free strategy.
  - The start opens the firewall rules itself where the job runs as root (C(firewall.start_opens)
    applied per node by its facts), except where the interconnect check needs the rules before
    the start; the job's supervisor closes what the start opened, and the teardown visits only
    the nodes whose rules are still in place (C(teardown)).
  - Where the launcher allows it (torchrun on the node itself), each node's launcher starts
    ahead, in preflight's facts call, and imports torch while the launch goes on; the start
    hands it the job (C(start.warm)). A node's C(torchherd_torchrun_warm) false turns it off.
positional: _input
options:
  _input:
    description: The plan (C(torchherd_plan)).
    type: dict
    required: true
  forks:
    description: Ansible's forks for this run (C(ansible_forks)).
    type: int
    required: true
  playbook:
    description: Which playbook runs (C(launch) or C(verify)); verify runs everything at once.
    type: str
    default: launch
    choices: [launch, verify]
  progress_every:
    description:
      - How often the caller wants word of a running job (seconds; 0, the default, asks
        nothing), for a live view such as the driver's table on a terminal.
      - The watch's round (C(watch.round)) is then at most this long where one wait speaks for
        the job (the master alone, or a single node), one task per round. Where every node is
        watched, or under the hang watch, the rounds stay the job's C(watch_interval), as a
        round on every node costs the controller a task per node.
    type: float
    default: 0
"""

EXAMPLES = r"""
- name: Schedule the launch
  ansible.builtin.set_fact:
    torchherd_schedule: "{{ torchherd_plan | torchherd.cluster.schedule(forks=ansible_forks | int) }}"
"""

RETURN = r"""
_value:
  description: The schedule.
  type: dict
  contains:
    nodes:
      description: The number of nodes.
      type: int
    forks:
      description: Ansible's forks.
      type: int
    all_at_once:
      description: Whether a task runs on every node at once (forks at least the node count).
      type: bool
    forks_needed:
      description: What of this run needs every node at once (empty where nothing does).
      type: list
      elements: str
    forks_ok:
      description: Whether the forks suffice for C(forks_needed).
      type: bool
    barrier:
      description: Where the start's barrier runs, C(start) (in the start's call), C(supervisors)
        or C(none).
      type: str
    gang:
      description: Whether the nodes' supervisors form the gang (fail-fast among the nodes).
      type: bool
    firewall:
      description: Who opens and closes the job's firewall rules.
      type: dict
      contains:
        start_opens:
          description: Whether the start opens the rules on the nodes where the job runs as
            root (the firewall role on the others); the supervisor closes them at the job's end.
          type: bool
    start:
      description: How each node's launcher starts.
      type: dict
      contains:
        warm:
          description: Whether it starts ahead, in preflight's facts call, and waits there for
            the start with its module imported (M(torchherd.cluster.node_facts)'s O(warm)) -
            not under srun, in the job's image, for a launcher without a C(WARM_MODULE), or where
            a node's C(torchherd_torchrun_warm) is false.
          type: bool
        module:
          description: The module it imports ahead, the launcher's (C(torch.distributed.run),
            C(accelerate.commands.launch), C(deepspeed.launcher.launch)), null where not warm.
          type: str
        deadline:
          description: Seconds a warm launcher waits for the start before it ends by itself.
          type: float
    watch:
      description: How the job is watched.
      type: dict
      contains:
        hosts:
          description: The nodes the watch waits on.
          type: list
          elements: str
        master_alone:
          description: Whether the master's wait speaks for every node (through its gang).
          type: bool
        strategy:
          description: The watch play's strategy, C(ansible.builtin.linear) or C(ansible.builtin.free).
          type: str
        stops_all:
          description: Whether every failed node's rescue stops every node (C(true) under the
            free strategy), or only the first failed one (the waits returned together).
          type: bool
        once:
          description: Whether the watch looks once and returns (a detached launch).
          type: bool
        if_gang_incomplete:
          description: What follows when a node could not join the master's gang,
            C(watch_every_node) or C(nothing).
          type: str
        round:
          description: Seconds one wait may last before it returns with the job still running
            (the job's C(watch_interval), shorter for O(progress_every)); 0 where it looks once.
          type: float
    restart:
      description: The whole-job restarts (the job's C(restarts) and C(restart_on)), which the
        driver acts on after a failed launch.
      type: dict
      contains:
        this:
          description: The restart this launch is (0, the first launch of the run id).
          type: int
        left:
          description: Restarts still allowed after this launch (0 detached, or for verify).
          type: int
        "on":
          description: The failure kinds a restart answers (empty where none is left).
          type: list
          elements: str
        excluded:
          description: The nodes this launch left out, and why (the plan's C(excluded)).
          type: dict
        by:
          description:
            - Who restarts the job after a failure - C(driver) (the driver's watch sees the
              failure and launches the run again without the failed node), C(torchrun) (a
              detached job that allows restarts - torchrun's elastic rendezvous restarts the
              workers on every node without a controller, and takes in a standby for a lost
              node), or C(none).
          type: str
          choices: [driver, torchrun, none]
        launcher:
          description: The worker-group restarts torchrun itself makes (its C(--max-restarts)) -
            the job's C(restarts) where C(by) is C(torchrun), else its C(max_restarts).
          type: int
        standbys:
          description: The nodes started to wait in torchrun's rendezvous for a lost node (the
            plan's standbys); empty unless C(by) is C(torchrun).
          type: list
          elements: str
        standby_delay:
          description: Seconds a standby's launcher starts after the barrier, so that the
            job's own nodes fill torchrun's rendezvous first (0 without standbys).
          type: float
    venv:
      description: Where the job's locked venv is made or found - C(facts) (each node, in
        preflight's facts call, before its Python is read), or C(none) without a lock.
      type: str
    container:
      description: Where the job runs - C(image) (each node finds or pulls the job's image in
        preflight's facts call; the launcher runs inside it), or C(none) without an image.
      type: str
    teardown:
      description: Which nodes the teardown visits, C(nodes_with_rules) (those whose rules are
        still in place after the watch) or C(none) (a detached launch keeps its rules until stop
        or collect).
      type: str
    why:
      description: For each decision, in words, why it came out as it did.
      type: dict
"""

LINEAR = "ansible.builtin.linear"
FREE = "ansible.builtin.free"


def _needs_every_node(plan, playbook):
    job = plan["job"]
    if playbook == "verify":
        return ["the master-port probe", "the interconnect check"]
    needs = []
    if job.get("interconnect") == "always":
        needs.append("the interconnect check (interconnect always)")
    if int(job.get("hang_timeout") or 0) > 0:
        needs.append("the hang watch (hang_timeout)")
    return needs


# How long a standby's launcher waits after the barrier's go: torchrun's rendezvous takes the
# first nodes to join, and a standby that joined before a node of the job would leave that node
# waiting in its place (correct, but not the plan's). Importing torch takes seconds on a busy
# node; a standby loses nothing by waiting.
STANDBY_DELAY = 10.0


def schedule(plan, forks, playbook="launch", progress_every=0):
    if not isinstance(plan, dict) or "nodes" not in plan or "job" not in plan:
        raise AnsibleFilterError("schedule: expected the plan (torchherd_plan), found "
                                 f"{type(plan).__name__}")
    job = plan["job"]
    hosts = [node["host"] for node in plan["nodes"]]
    master = plan["master"]["host"]
    forks = int(forks)
    barrier = plan.get("barrier", True)
    all_at_once = forks >= len(hosts)
    needed = _needs_every_node(plan, playbook)
    why = {}

    if not barrier and all_at_once:
        where = "none"
        why["barrier"] = "turned off (torchherd_torchrun_barrier false): no barrier, no gang"
    elif all_at_once:
        where = "start"
        why["barrier"] = "every node is in the start's call at once"
    else:
        where = "supervisors"
        why["barrier"] = (f"fewer forks ({forks}) than nodes ({len(hosts)}): later nodes start "
                          "while the first wait, so the supervisors meet"
                          + ("; on although turned off, because the gang forms there and is "
                             "the only fail-fast that reaches every node" if not barrier else ""))
    gang = where != "none"

    detach = bool(job.get("detach"))
    static = job.get("rdzv", "static") == "static"
    hang = int(job.get("hang_timeout") or 0) > 0
    # The free strategy, every node waiting on its own job, where the controller must act on one
    # node's word at once: no gang to stop the others, or the hang watch (the node that declares
    # the hang reads every rank's stack right then).
    free = hang or not gang
    # verify starts no job; a job started on its plan (the roles on their own) is watched on
    # every node.
    master_alone = playbook == "launch" and (
        (not all_at_once) or (not free and static and not detach))
    if playbook == "verify":
        why["watch"] = "verify starts no job: a job started on its plan is watched on every node"
    elif not all_at_once:
        why["watch"] = ("fewer forks than nodes: a wait in flight on every node would queue the "
                        "others for the whole job; the master's gang speaks for every node")
    elif master_alone:
        why["watch"] = "the nodes form the gang and the job is static: the master speaks for all"
    elif not gang:
        why["watch"] = "no gang: every node waits on its own job, a failure stops every node"
    elif hang:
        why["watch"] = "the hang watch: every node watches its own ranks' activity"
    elif detach:
        why["watch"] = "detached: every node is looked at once"
    else:
        why["watch"] = "elastic: the job goes on without lost nodes, the master's among them"
    watch = {
        "hosts": [master] if master_alone else hosts,
        "master_alone": master_alone and len(hosts) > 1,
        "strategy": FREE if free else LINEAR,
        # Under the linear strategy every wait has returned when a rescue runs: the gang ended
        # the job everywhere, one node's stop is the check that nothing runs.
        "stops_all": free,
        "once": detach,
        "if_gang_incomplete": "watch_every_node" if master_alone and len(hosts) > 1 else "nothing",
    }
    interval = float(job.get("watch_interval") or 0)
    progress_every = float(progress_every or 0)
    if detach:
        watch["round"] = 0
        why["round"] = "detached: the watch looks once"
    elif progress_every > 0 and len(watch["hosts"]) == 1 and not hang and interval > progress_every:
        watch["round"] = progress_every
        why["round"] = (f"a live view asked for word every {progress_every:g} s, and one wait "
                        "speaks for the job: one task per round")
    else:
        watch["round"] = interval
        why["round"] = "the job's watch_interval" + (
            " (a live view's rounds on every node would cost a task per node each)"
            if progress_every > 0 and interval > progress_every else "")

    start_opens = job.get("interconnect") != "always" and playbook == "launch"
    why["firewall"] = ("the start opens the rules in its own round trip where the job runs as "
                       "root (the firewall role elsewhere); the supervisor closes them"
                       if start_opens else
                       "the firewall role opens the rules before the start: "
                       + ("the interconnect check needs them" if playbook == "launch"
                          else "verify measures over them"))
    # Whole-job restarts: the driver reads this after a failed launch and acts on it.
    allowed = int(job.get("restarts") or 0)
    this = int(plan.get("restart") or 0)
    left = 0 if detach or playbook != "launch" else max(0, allowed - this)
    on_nodes = detach and allowed > 0 and playbook == "launch"
    standbys = [node["host"] for node in plan["nodes"] if node.get("standby")]
    restart = {"this": this, "left": left,
               "on": list(job.get("restart_on") or []) if left or on_nodes else [],
               "excluded": dict(plan.get("excluded") or {}),
               "by": "torchrun" if on_nodes else "driver" if left else "none",
               "launcher": allowed if on_nodes else int(job.get("max_restarts") or 0),
               "standbys": standbys if on_nodes else [],
               "standby_delay": STANDBY_DELAY if on_nodes and standbys else 0.0}
    if playbook != "launch":
        why["restart"] = "verify starts no job"
    elif on_nodes:
        why["restart"] = (
            f"detached with restarts {allowed}: torchrun restarts the workers on every node "
            f"after any failure (its --max-restarts), without a controller; its rendezvous "
            f"takes in a standby for a lost node ("
            + (", ".join(standbys) + f", started {STANDBY_DELAY:g} s after the others"
               if standbys else "none: the job goes on with fewer nodes where min_node_count "
               "allows") + "); the master node hosts the rendezvous and cannot be lost")
    elif detach:
        why["restart"] = "detached: nothing watches the job to see it fail"
    elif not allowed:
        why["restart"] = "the job allows no restart (restarts 0)"
    else:
        why["restart"] = (f"restart {this} of {allowed}: a failure of a kind in restart_on "
                          f"({', '.join(restart['on']) or 'none left'}) launches the run again "
                          "without the failed node" if left else
                          f"restart {this} of {allowed}: the restarts are spent")
    # The job's locked venv: where it is made (or found), and what a relaunch pays for it.
    venv = "facts" if plan.get("venv") else "none"
    why["venv"] = (f"the job's lock {(job.get('venv') or {}).get('lock')}: each node makes its "
                   "venv, or finds the one the same lock made, in preflight's facts call, before "
                   "its Python is read; an unchanged lock costs a file check"
                   if plan.get("venv") else "no lock: the job runs each node's own Python")
    # The job's image: where it is found (or pulled) and what runs in it.
    image = plan.get("container") or {}
    container = "image" if image else "none"
    why["container"] = (
        f"the job's image {image.get('image')}: each node finds its {image.get('runtime')} "
        f"runtime and the image (pull {image.get('pull')}) in preflight's facts call, which "
        "reads torch inside it (cached while the image's id is the same); the start runs the "
        "launcher in it" if image else "no image: the launcher runs on each node itself")
    # The launcher started ahead, in preflight's facts call, so that its imports (torch) are
    # done by the start; it waits for the start up to its deadline, a minute and a second per
    # node (the forks' batches and the sync come between).
    module = LAUNCHERS[job.get("launcher") or "torchrun"].WARM_MODULE
    warm_off = ("turned off (torchherd_torchrun_warm false)" if not plan.get("warm", True) else
                "verify starts no job" if playbook != "launch" else
                f"the launcher {job.get('launcher')} starts anew" if not module else
                "the launcher runs in the job's image" if image else
                "srun starts the launcher" if job.get("spawn") == "srun" else None)
    start = {"warm": warm_off is None, "module": module if warm_off is None else None,
             "deadline": 60.0 + len(hosts)}
    why["start"] = (
        f"each node's launcher starts in preflight's facts call and imports {module} while the "
        f"launch goes on; the start hands it the job (where none waits, or under srun, it "
        f"starts anew); unclaimed, it ends after {start['deadline']:g} s"
        if warm_off is None else f"the launcher starts with the start: {warm_off}")
    teardown = "none" if detach else "nodes_with_rules"
    why["teardown"] = ("detached: the rules stay until stop or collect of the run id"
                       if detach else "the nodes whose rules are still in place after the watch")
    return {
        "playbook": playbook,
        "nodes": len(hosts),
        "forks": forks,
        "all_at_once": all_at_once,
        "forks_needed": needed,
        "forks_ok": all_at_once or not needed,
        "barrier": where,
        "gang": gang,
        "firewall": {"start_opens": start_opens},
        "start": start,
        "watch": watch,
        "teardown": teardown,
        "restart": restart,
        "venv": venv,
        "container": container,
        "why": why,
    }


class FilterModule:
    """torchherd schedule filter."""

    def filters(self):
        return {"schedule": schedule}
