# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The launch's schedule: every decision of how a launch runs, made once, from the plan and the
settings. The plays and roles read it (torchherd_schedule); none of them decides again. Each
decision is one small function with its rule, listed in one table: plugin_utils/_schedule."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.plugin_utils._schedule.decisions import (
    FREE,
    LINEAR,
    decide,
    launch,
)

DOCUMENTATION = r"""
name: schedule
author: torchherd developers
version_added: 0.2.0
short_description: Decide how a launch runs (batching, barrier, firewall, gang, watch, teardown)
description:
  - A pure function of the plan (C(torchherd.cluster.plan), which carries the start barrier's
    setting), the playbook, the number of Ansible forks and which nodes are in a SLURM job.
    Computed once per run by the plan role, written to the run directory as C(schedule.json),
    and read by the plays and roles of the launch.
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
      - That one wait also returns as soon as a node's last line changed, at most every
        second (C(watch.lines)), so that a live view shows every node's line about 2 s behind.
    type: float
    default: 0
  prior:
    description:
      - The last launch of the same job on the same nodes whose preflight passed - C(run_id)
        and C(facts), that preflight's facts by host - as the plan phase found it in the runs
        directory; null where there is none. With it a relaunch's starts may come with the
        facts call (C(start.with_facts)).
    type: dict
"""

EXAMPLES = r"""
- name: Schedule the launch
  ansible.builtin.set_fact:
    torchherd_schedule: >-
      {{ torchherd_plan | torchherd.cluster.schedule(forks=ansible_forks | int) }}
"""

RETURN = r"""
_value:
  description: The schedule.
  type: dict
  contains:
    playbook:
      description: The playbook the schedule is for, C(launch) or C(verify).
      type: str
    nodes:
      description: The number of nodes.
      type: int
    forks:
      description: Ansible's forks.
      type: int
    all_at_once:
      description: Whether a task runs on every node at once (forks at least the node count).
      type: bool
    waves:
      description: How many waves each task runs in - 1 with a worker per node, else the nodes
        over the forks (the live view and the summary say that the launch ran in waves).
      type: int
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
        with_facts:
          description:
            - Whether each node's start comes with preflight's facts call (a relaunch of the same
              job on the same nodes whose last preflight passed, O(prior)); a node whose facts
              changed refuses, and the launch then takes the full path.
          type: bool
        sample_every:
          description: Seconds between two samples of each node's use (its GPUs' utilization
            and memory, its CPU and memory) into its run record while the job runs, the job's
            C(sample_interval); 0 where nothing is sampled.
          type: float
    spawn:
      description: How each node's launcher is started, by host (the plan's nodes and spares) -
        C(ssh) (the node's supervisor runs it) or C(srun) (a step of the node's SLURM job; the
        job's C(spawn) auto on the nodes of a SLURM job).
      type: dict
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
        lines:
          description: Seconds after which the wait that speaks for the job (the master's for
            its gang, or a single node's) also returns where a node's last line changed, for a
            live view (O(progress_every), at most 1 s); 0 where the lines come with the rounds.
          type: float
        hang:
          description: Whether each wait also runs the hang watch (the job's C(hang_timeout),
            not detached).
          type: bool
        lost_fails:
          description: Whether a node lost over SSH fails the watch and stops the gang (a static
            rendezvous; an elastic one goes on without it).
          type: bool
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

__all__ = ["FREE", "LINEAR", "schedule"]


def schedule(plan, forks, playbook="launch", progress_every=0, prior=None):
    if not isinstance(plan, dict) or "nodes" not in plan or "job" not in plan:
        raise AnsibleFilterError("schedule: expected the plan (torchherd_plan), found "
                                 f"{type(plan).__name__}")
    return decide(launch(plan, forks, playbook, progress_every, prior))


class FilterModule:
    """torchherd schedule filter."""

    def filters(self):
        return {"schedule": schedule}
