#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: torchrun_job
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: Start, watch and stop one node's part of a torchrun job
description:
  - O(state=started) starts C(python -m torch.distributed.run) detached, in a session of its own,
    under a small supervisor that writes the exit code when torchrun ends. The run directory
    C(<root>/runs/<run_id>) holds the command line, the environment (secret values redacted),
    the pid, the node log, torchrun's per-rank logs and error files, and the exit code.
  - O(state=status) reports the job's state on this node without waiting.
  - O(state=waiting) waits until the job ends on this node or O(wait_timeout) seconds pass,
    whichever comes first, then reports; a watch loop repeats it. Where the node does not answer
    over SSH, the call is made once more on a fresh connection (the collection's action plugin
    of this module); a second failure returns RV(lost) with C(unreachable).
  - O(state=stopped) sends SIGTERM to torchrun (which stops its workers), then SIGKILL after
    O(grace) seconds to every process that carries the run's marker; nothing of the job remains.
    Once the workers have ended, torchrun itself gets 2 s more, not the whole grace. Only the
    first stopper of a run sends the SIGTERM; a second stop waits and kills what is left.
    Where the run never started on the node, it ends the launcher that preflight started ahead
    for it (O(warm)), if one still waits, and writes nothing.
  - Every process of the job inherits C(TORCHHERD_RUN=<run dir>) in its environment, which is how
    stop and stale-job checks find workers that torchrun put in sessions of their own.
  - With O(wrapper), the supervisor runs torchrun through that command instead, e.g. C(srun), so
    that torchrun runs as a step of a SLURM job; the run directory, states, stop and the marker
    stay the same.
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.ACTION
attributes:
  action:
    details: The module runs on the node; the action only asks once more, on a fresh connection,
      when a wait cannot reach the node.
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: partial
    details: A second start of the same run id fails (a run id starts once, and its run directory
      is there) unless it is a restart (O(restart)) of a job that ended; status and waiting
      change nothing; stopping a stopped job changes nothing.
options:
  state:
    description: What to do.
    type: str
    choices: [started, status, waiting, stopped]
    default: status
  run_id:
    description: Run id of the job.
    type: str
    required: true
  restart:
    description:
      - The whole-job restart this start is (0, the first launch of the run id). With O(state=started)
        and a restart above 0, a run of this run id that ended on the node is kept under
        C(restarts/<n>) in its run directory and the job starts again; one still running is
        refused as always. The job's environment has it as C(TORCHHERD_RESTART).
    type: int
    default: 0
  root:
    description: torchherd's directory on the node; runs live in C(<root>/runs/<run_id>).
    type: path
    required: true
  python:
    description: Interpreter that runs torchrun; empty means the one running this module. C(~) is the node user's home.
    type: path
    default: ""
  launcher:
    description:
      - The program that starts the job's processes on this node.
      - V(torchrun), C(python -m torch.distributed.run); V(accelerate), C(python -m
        accelerate.commands.launch --multi_gpu) with the plan's machine rank, machine count,
        total process count, main process address and port (and C(ACCELERATE_USE_CPU=1) with
        O(use_cpu)), or with one process in all no C(--multi_gpu) (accelerate refuses it) and
        accelerate runs the script itself; V(deepspeed), C(python -m deepspeed.launcher.launch) with the node rank,
        master address and port and a world description of O(nnodes) nodes of
        O(nproc_per_node) processes each.
      - accelerate runs torch.distributed.run in its own process, so its per-rank logs and error
        files are torchrun's (with one process in all, its output is in the node log); DeepSpeed's launcher writes no per-rank files (its ranks' output is
        in the node log).
    type: str
    default: torchrun
    choices: [torchrun, accelerate, deepspeed]
  launcher_args:
    description: Options of the launcher itself, placed before the script.
    type: list
    elements: str
    default: []
  use_cpu:
    description: The node has no GPU (accelerate's multi-process mode then needs C(ACCELERATE_USE_CPU=1)).
    type: bool
    default: false
  torch_version:
    description:
      - The torch version of the job's interpreter (the node's facts); it names the variable
        that sizes the Flight Recorder of an NCCL job (C(TORCH_FR_BUFFER_SIZE) from torch 2.11
        on, C(TORCH_NCCL_TRACE_BUFFER_SIZE) before). Empty means the older name.
    type: str
    default: ""
  script:
    description: Training script, relative to O(chdir) or absolute. Required with O(state=started).
    type: str
  args:
    description: Script arguments.
    type: list
    elements: str
    default: []
  chdir:
    description: Working directory of the job (the synced code).
    type: path
  nnodes:
    description: Number of nodes, or C(MIN:MAX) for elastic rendezvous.
    type: str
    default: "1"
  nproc_per_node:
    description: Worker processes on this node.
    type: int
    default: 1
  node_nprocs:
    description:
      - Worker processes of every node in node-rank order, where nodes run different counts;
        the deepspeed launcher's world description needs them all. Empty means
        O(nproc_per_node) on every node.
    type: list
    elements: int
    default: []
  node_rank:
    description: This node's rank (static rendezvous).
    type: int
    default: 0
  master_addr:
    description: Address of the master node.
    type: str
    default: 127.0.0.1
  master_port:
    description: Rendezvous port on the master.
    type: int
    default: 29500
  rdzv:
    description:
      - C(static) passes O(node_rank); C(c10d) uses elastic rendezvous on the master.
      - With C(c10d) the job runs with C(TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) unless O(env) sets
        it. With the shared store (torch's default) restarted workers find the previous attempt's
        keys in it, and gloo connects to the dead workers' addresses ("Connection refused") until
        the restarts run out; unshared, every rendezvous round gets a fresh store (on a free port
        of the new rank 0 node, which a C(ports) firewall must allow).
    type: str
    choices: [static, c10d]
    default: static
  max_restarts:
    description: Worker group restarts allowed.
    type: int
    default: 0
  rdzv_conf:
    description: Extra c10d rendezvous settings (C(--rdzv-conf key=value,...)).
    type: dict
    default: {}
  env:
    description: Environment of the job.
    type: dict
    default: {}
  secret_env:
    description: Environment of the job whose values are never returned, logged or written.
    type: dict
    default: {}
  secret_env_var:
    description:
      - Name of a variable holding a job (a mapping with a C(secret_env) mapping), whose secret
        values the collection's action for this module adds to O(secret_env) when it runs, so
        that no task argument holds them (callbacks see a task's arguments once templated,
        C(no_log) notwithstanding). Names in O(secret_env) win.
      - The launch's start passes C(torchherd_job).
    type: str
  timeout:
    description: Wall-clock limit in seconds after which the supervisor stops the job; 0 means none.
    type: int
    default: 0
  wait_timeout:
    description: Longest wait in seconds for O(state=waiting).
    type: float
    default: 5
  grace:
    description: Seconds between SIGTERM and SIGKILL when stopping (for the workers; torchrun
      alone gets 2 s after its workers ended).
    type: float
    default: 10
  hang:
    description:
      - With O(state=waiting), watch the job for a hang as well. The wait also returns when the
        node goes quiet (no output of any of its ranks, and no touch of the progress file, for
        O(hang.timeout) seconds) while O(hang.quiet_since) is 0, when it shows progress after
        the quiet spell O(hang.quiet_since) names, and when the job was declared hung (the
        run's C(hung) file); it looks once a second.
      - The collection's action of this module tells O(hang.quiet_since) from what the node
        reported before, and declares the job hung once every node is quiet (RV(activity)).
    type: dict
    suboptions:
      timeout:
        description: Seconds without progress after which the node counts as quiet.
        type: float
        required: true
      quiet_since:
        description: The node's last progress (its clock) as last reported quiet; 0 when the
          controller counts the node as active.
        type: float
        default: 0
  gang:
    description:
      - With O(state=waiting) on the master, wait for the whole gang as well, not only this
        node's job; the master's supervisor stays until every node's supervisor said its
        launcher ended, or was lost (RV(gang_ended)). The launch's watch waits this way on the
        master alone where the nodes form the gang.
      - That speaks for every node only where every node joined the gang; where one did not
        (RV(gang_complete) false, RV(gang_formed) says how many did), the wait returns at once,
        so that the caller can watch every node itself.
    type: bool
    default: false
  meta:
    description: Extra facts recorded in C(meta.json) (host, node_rank); returned by status.
    type: dict
    default: {}
  wrapper:
    description:
      - Command, as an argv list, that runs torchrun's command line given after it, such as
        C([srun, --jobid=42, --nodelist=node3, --nodes=1, --ntasks=1, --overlap, --export=ALL]).
      - It must pass on its environment (the run's marker) and its exit code. Empty runs
        torchrun directly.
    type: list
    elements: str
    default: []
  warm:
    description:
      - Hand the start to the launcher that preflight started ahead for this run
        (M(torchherd.cluster.node_facts)'s O(torchherd.cluster.node_facts#module:warm)), which
        has imported the launcher's module (torch) by then. It takes the launcher's command
        line, environment (secrets too, over a socket only this user can use) and directory and
        runs as the launcher would; the run-state record says whether it did (C(job.warm) -
        C(used), C(pid), C(waited), and when it started, was done with its imports and was
        asked for the job, C(started_at), C(ready_at), C(asked_at), the node's clock; or C(why)
        not).
      - Where none waits (none was started, its deadline passed, its import failed, another
        interpreter or module), the launcher starts anew, as without this option. Never with a
        O(wrapper) or O(container).
    type: bool
    default: false
  standby:
    description:
      - Set on every node of a job whose restarts are torchrun's own (a detached job that
        allows restarts, O(rdzv=c10d)), where spares wait in torchrun's rendezvous as standbys.
      - A node whose launcher ends without having started workers waited there and was not
        needed (torchrun ends it with an error once the job's rendezvous closes or its master
        is gone). Its end is the state C(standby), exit code 0 for the gang and the summary,
        and the launcher's own code is in the run-state record (C(job.standby)). A node that
        started workers, or was stopped, ends as any other.
    type: dict
    suboptions:
      delay:
        description: Seconds the launcher starts after the barrier (a standby, so that the
          job's own nodes fill the rendezvous first).
        type: float
        default: 0
  container:
    description:
      - The job's image, as M(torchherd.cluster.node_facts) found it on this node (its
        C(container) result) with the job's own volumes and options. The launcher runs inside
        it (C(<runtime> run --rm --network host --ipc host)), named
        C(torchherd-<run_id>-n<node_rank>-r<restart>), with O(chdir) and the run directory
        mounted at their own paths, O(chdir) as its working directory, the job's environment
        passed by name (values in the runtime's environment, not on its command line) and the
        node's GPUs where O(container.gpus). O(python) is the image's interpreter.
      - O(secret_env) reaches the job through the launcher's standard input, read by a few
        lines of Python in the image before the launcher starts in its place - on no command
        line, in no file, not in what the runtime's C(inspect) shows.
      - Stop ends the container's processes as any job's (they carry the run's marker) and
        removes the container. Empty (the default) runs the launcher on the node itself.
    type: dict
    suboptions:
      runtime:
        description:
          - C(podman), C(docker), C(apptainer) or C(singularity).
          - apptainer runs O(container.id) (the SIF file) with C(exec --cleanenv), the job's
            environment given as C(APPTAINERENV_<name>) in its own, O(chdir) and the run
            directory bound at their paths and C(--nv) for the GPUs; its processes are the
            host's (network, IPC, PIDs), so there is no container to name or remove.
        type: str
        required: true
        choices: [podman, docker, apptainer, singularity]
      path:
        description: The runtime's executable.
        type: path
        required: true
      image:
        description: The image's name.
        type: str
        required: true
      id:
        description: The image's id (what runs; for apptainer the SIF file's path); empty runs
          O(container.image).
        type: str
        default: ""
      gpus:
        description: Give the container every GPU of the node.
        type: bool
        default: false
      volumes:
        description: The job's own volumes, in the runtime's C(--volume) syntax.
        type: list
        elements: str
        default: []
      options:
        description: The job's own options of the runtime's C(run).
        type: list
        elements: str
        default: []
  barrier:
    description:
      - With O(state=started), the last check before the start and a start barrier in one;
        the node with O(barrier.listen=true) (the master) listens on O(master_port) while every
        node, the master too, connects to O(master_addr):O(master_port) and reads the run's
        token. Once all O(barrier.expect) nodes have come, the master tells each to go and
        every node starts torchrun at once; if any node cannot reach the master within
        O(barrier.window) seconds, no node starts.
      - This proves the very path the job's rendezvous takes, right before it takes it, in the
        same round trip as the start. RV(probe) tells what this node saw.
      - The master also connects back to every node at the address it came from, and then
        names every node's port to every node, and each connects to all the others at once
        from its own address (the pairs), as gloo and NCCL connect every rank to every other on
        the job's interfaces. A pair that cannot connect calls the start off on every node,
        naming both nodes, the address and the port (C(pairs_failed) of RV(probe)). The ports are
        ones the kernel picks, as gloo's and NCCL's, so the job's firewall rules let them in
        as they let the job's own (mode C(ports) with the kernel's port range pinned to
        them). It costs a node one connection per other node, in parallel (64 at a time),
        milliseconds where every pair connects, at most twice O(barrier.timeout) per 64 other
        nodes where one does not answer.
      - Run on every node of the job in one task (forks at least the number of nodes), unless
        O(barrier.background).
      - The go names a port of the master's supervisor. Every node's supervisor keeps a
        connection to it (the gang), and the first failure anywhere stops the job on every
        node without the controller; a failure is a launcher that ends with an error, or,
        without restarts, any worker that does (told the moment it ends, not once the
        launcher has handled it), or (static rendezvous) a node lost.
    type: dict
    suboptions:
      background:
        description:
          - Meet at the barrier in the detached supervisor instead of in this call, which
            returns as soon as the supervisor runs (RV(job_state) running, no RV(probe)); the
            launcher starts once every node came. For launches on more nodes than Ansible
            forks, whose later nodes start while the first wait. A barrier that does not say
            go ends the job on that node as failed (the C(barrier) section of the run-state
            record, RV(record), says why).
          - The supervisors form the gang then as they do after the barrier in this call.
        type: bool
        default: false
      listen:
        description: This node is the master and listens.
        type: bool
        default: false
      expect:
        description: Nodes of the job, the master included.
        type: int
        default: 1
      timeout:
        description: Seconds one connection attempt may wait for the handshake and the token.
        type: float
        default: 3
      window:
        description: Seconds the master waits for every node, and a node retries a refused
          connection (the master may listen a moment after a node first tries).
        type: float
        default: 20
      source:
        description:
          - The local address this node connects from, the one of the interface the job's
            traffic uses (RV(torchherd.cluster.node_facts#module:interface)); the master's answer
            must come back to it, as the job's peers must. Empty lets the kernel pick.
        type: str
        default: ""
  firewall:
    description:
      - With O(state=started), the job's firewall rules (see M(torchherd.cluster.firewall_rules),
        whose options these are, for the run O(run_id)) opened in this call, before the
        barrier. A node reaches the barrier only with its rules in place, so no node starts
        before every node lets the others in. Saves the separate firewall round trip where
        the job runs as root anyway; needs root like that module.
      - With O(state=waiting), the run's rules are removed in the same call once the job has
        ended on this node (as that module's O(state=absent) with O(firewall.backend)), so that
        no teardown round trip is needed; a rule that cannot be removed is reported in
        RV(firewall), never as the job's failure.
      - RV(firewall) reports what was opened or removed.
    type: dict
    suboptions:
      peers:
        description: Addresses (or networks, or names resolved on the node) of the job's other nodes.
        type: list
        elements: str
        default: []
      mode:
        description: C(members) allows any TCP port from the peers, C(ports) only O(firewall.ports).
        type: str
        choices: [members, ports]
        default: members
      ports:
        description: With O(firewall.mode=ports), the TCP ports and ranges to allow.
        type: list
        elements: str
        default: []
      backend:
        description: Where the rules go; C(auto) detects it, C(none) changes nothing.
        type: str
        choices: [auto, nftables, ufw, firewalld, iptables, none]
        default: auto
      persistent:
        description: Keep the rules across a reboot, until they are removed.
        type: bool
        default: false
"""

EXAMPLES = r"""
- name: Start node 1 of a 2-node job
  torchherd.cluster.torchrun_job:
    state: started
    run_id: demo-1
    root: /var/tmp/torchherd
    script: allreduce.py
    chdir: /var/tmp/torchherd/code/allreduce
    nnodes: "2"
    nproc_per_node: 2
    node_rank: 1
    master_addr: 10.0.0.1
    master_port: 29500

- name: Wait up to 5 s for the job to end on each node
  torchherd.cluster.torchrun_job:
    state: waiting
    run_id: demo-1
    root: /var/tmp/torchherd
    wait_timeout: 5

- name: Stop the job
  torchherd.cluster.torchrun_job:
    state: stopped
    run_id: demo-1
    root: /var/tmp/torchherd
"""

RETURN = r"""
lost:
  description:
    - With O(state=waiting), true when the node did not answer over SSH on two tries; the
      result then also has C(unreachable) and no job state.
  returned: when the node was not reached twice
  type: bool
  sample: true
job_state:
  description: State on this node.
  returned: always
  type: str
  sample: running
  choices: [absent, running, succeeded, failed, stopped, timed_out, standby, lost]
exit_code:
  description: torchrun's exit code once it ended (negative for a signal), else null.
  returned: always
  type: int
  sample: 0
pid:
  description: Pid of torchrun (also its process group), null if the job never started here.
  returned: always
  type: int
  sample: 4242
run_dir:
  description: Run directory on the node.
  returned: always
  type: str
  sample: /var/tmp/torchherd/runs/demo-1
log:
  description: Path of the node log (torchrun's output with per-rank prefixes).
  returned: always
  type: str
  sample: /var/tmp/torchherd/runs/demo-1/node.log
last_line:
  description: Last non-empty line of the node log.
  returned: always
  type: str
  sample: "[default0]:rank 0 ok"
gang_ended:
  description: With O(gang), whether the job has ended on every node of a complete gang.
  returned: with O(gang)
  type: bool
  sample: true
gang_lost:
  description: With O(gang), once the gang has ended, the nodes (names) whose link to the
    master's gang closed without their launcher's end.
  returned: with O(gang)
  type: list
  elements: str
  sample: ["node3"]
gang_complete:
  description: With O(gang), whether every other node joined the master's gang.
  returned: with O(gang)
  type: bool
  sample: true
gang_formed:
  description: With O(gang), where the gang is not complete, how many of the other nodes joined
    it (C(joined)), how many should have (C(expected)), and why not (C(error)) where the master
    had no gang at all.
  returned: with O(gang), where RV(gang_complete) is false and the gang has formed
  type: dict
  sample: {"joined": 6, "expected": 7}
activity:
  description:
    - With O(hang), the node's last progress (C(last), its clock, null before any), whether it
      is C(quiet) for O(hang.timeout) seconds, and whether the job was declared C(hung).
    - The action adds C(hang_state) (C(active), C(quiet), C(hung)) and, on the node whose wait
      declared the hang, C(hang_declared).
  returned: with O(state=waiting) and O(hang)
  type: dict
  sample: {last: 1795499931.9, quiet: true, hung: false}
cmd:
  description: The torchrun command line (after O(wrapper), if any), as an argv list.
  returned: when O(state=started)
  type: list
  elements: str
  sample: [/usr/bin/python3, -m, torch.distributed.run, --nnodes, "2"]
killed:
  description: Pids that needed SIGKILL when stopping.
  returned: when O(state=stopped)
  type: list
  elements: int
  sample: []
started_at:
  description: Unix time the job started on this node.
  returned: when the job started
  type: float
  sample: 1763700000.5
checked_at:
  description: Unix time (the node's clock) this state was read; of two reports on one node, the later one wins.
  returned: except when O(state=started)
  type: float
  sample: 1763700011.0
received_at:
  description:
    - Unix time (the controller's clock) the answer came back to the controller (the module's
      action sets it). With RV(checked_at) it gives how far the node's clock is off.
  returned: unless the node was unreachable
  type: float
  sample: 1763700011.2
ended_at:
  description: Unix time the job ended on this node.
  returned: when the job ended
  type: float
  sample: 1763700010.2
started:
  description: Whether this call started the job (false when the barrier called it off).
  returned: when O(state=started)
  type: bool
  sample: true
probe:
  description:
    - What the barrier saw here (O(barrier)); C(reachable) false names why this node could not
      reach the master port, C(served) is the number of nodes the master heard from.
    - C(address) is the local address this node connected from; C(back_error) says why the
      master could not connect back to it there (null when it could); on the master,
      C(back_failed) maps each address it could not connect back to to the reason.
    - C(pairs_failed), where a node could not connect to another (the pairs, O(barrier)),
      lists every such pair as a problem (C(host) C(node -> peer), C(check), C(expected) with both
      addresses and the port, C(found), C(fix)), at most 100, on every node; C(error) then
      names them.
  returned: when O(barrier) is set
  type: dict
  sample: {reachable: true, error: null, seconds: 0.004, served: 3, address: 10.67.101.10,
           back_error: null, back_failed: {}}
firewall:
  description:
    - What O(firewall) opened or removed here, as M(torchherd.cluster.firewall_rules) returns it
      (C(changed), C(backends), C(detected), C(rules), C(peers), C(msg)); C(rules) is empty
      where no firewall is active, and after a removal. C(error) says why a removal failed
      (the rules are still there then).
    - With O(state=waiting), where the job's supervisor removed them already at the job's end,
      only C(changed) false and C(closed_by) C(supervisor).
  returned: when O(firewall) is set, with O(state=started), and with O(state=waiting) once the job has ended
  type: dict
  sample:
    changed: false
    backends: []
    rules: []
    msg: "no firewall is active on this node (firewalld missing, iptables inactive, nftables inactive, ufw missing): nothing to open"
record:
  description:
    - The node's run-state record of the run (C(run.json) in the run directory), as it is after
      this call; C(seq) grows with every write, so of two copies the higher one is newer
      (filter C(torchherd.cluster.run_state) takes the newest).
    - C(job) (C(started_at), C(pid); C(first_output_at), the first output of a rank,
      C(exit_code), C(ended_at) from the supervisor;
      C(stopped_at), C(killed) from a stop), C(barrier) (C(where) it ran, C(go), what it saw),
      C(gang) (on the master, C(joined), C(expected), C(lost)), C(firewall) (C(opened_by),
      C(rules); C(closed_by), C(error)).
  returned: except in check mode, and with O(state=started) where the start failed
  type: dict
  sample:
    schema: 1
    seq: 4
    updated_at: 1763700010.3
    job: {started_at: 1763700000.5, pid: 4242, first_output_at: 1763700004.1, exit_code: 0, ended_at: 1763700010.2}
    barrier: {where: start, go: true, served: 2}
    gang: {joined: 1, expected: 1, lost: []}
    firewall: {opened_by: start, rules: ["tcp dport 29500 ip saddr 10.0.0.2 accept"], closed_by: supervisor, error: null}
meta:
  description: What O(meta) recorded at start, and O(wrapper) when one was given.
  returned: always
  type: dict
  sample: {host: node0, node_rank: 0}
"""

import os
import socket
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import (
    RULE_OPTIONS,
    FirewallError,
    Runner,
    close_rules,
    converge_rules,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS
from ansible_collections.torchherd.cluster.plugins.module_utils._probe import barrier, bind
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    job_pids,
    last_activity,
    last_line,
    load_json,
    read_state,
    run_paths,
    sleep_until_gone,
    supervisor_alive,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    empty,
    read_record,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record
from ansible_collections.torchherd.cluster.plugins.module_utils._stop import stop as stop_job
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor import (
    StartError,
    barrier_seen,
    check_start,
    gang_formed,
    launcher_argv,
    spawn,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._warm import dismiss


def start(module, p, paths):
    """Open the start's rules, meet at the barrier (in this call or, in the background, in the
    supervisor) and start the job; the result's fields."""
    check_start(p, paths)
    argv = launcher_argv(p, paths)
    # The job's firewall rules before the barrier: a node reaches it only once its own rules
    # are in place, so no node starts before every node's firewall lets the others in.
    opened = {}
    if p["firewall"] is not None:
        opened["firewall"] = converge_rules(Runner(module), dict(p["firewall"], state="present",
                                                                 run_id=p["run_id"]))
    changed = bool(opened and opened["firewall"]["changed"])
    if module.check_mode:
        return dict(changed=True, job_state="absent", pid=None, exit_code=None, cmd=argv,
                    run_dir=paths["dir"], log=paths["log"], last_line="", meta=p["meta"],
                    **opened)
    # What the record gets once the job starts: a start the barrier calls off leaves no run
    # directory on the node (nothing started), its answer says what it saw.
    seen = empty()
    if opened.get("firewall", {}).get("rules"):
        seen["firewall"] = {"opened_by": "start", "rules": opened["firewall"]["rules"],
                            "backends": opened["firewall"].get("backends") or []}
    probe = gang = None
    if p["barrier"] and not p["barrier"]["background"]:
        b = p["barrier"]
        # The go names the master's gang port: the nodes stop each other after a failure
        # (see _gang), whatever the controller watches.
        gang_sock = bind(0)[0] if b["listen"] else None
        probe = barrier(p["master_addr"], p["master_port"], p["run_id"], b["timeout"],
                        b["window"], listen=b["listen"], expect=b["expect"],
                        source=b["source"] or None, gang=gang_sock,
                        name=str(p["meta"].get("host") or socket.gethostname()))
        seen["barrier"] = dict(barrier_seen(probe), where="start")
        gang = {"sock": gang_sock} if b["listen"] else {"port": probe.get("gang_port")}
        probe.pop("gang_port", None)
        if not probe.pop("go"):
            if gang_sock is not None:
                gang_sock.close()
            if p["warm"]:
                dismiss(paths["dir"])  # nothing starts: the launcher preflight started goes
            return dict(changed=changed, started=False, job_state="absent", pid=None,
                        exit_code=None, cmd=argv, run_dir=paths["dir"], log=paths["log"],
                        last_line="", meta=p["meta"], probe=probe, record=seen, **opened)
        if b["listen"] and gang_sock is None:
            gang = None  # no port for the gang here: the controller's watch stops the others
            gang_formed(paths, 0, b["expect"] - 1, "no port for the gang on the master")
    # The rules opened here go again as soon as the job ends on this node, by its supervisor,
    # also where no controller watches any more (detached, or gone).
    close = p["firewall"] if opened and opened["firewall"].get("rules") else None
    started_at = spawn(p, paths, argv, os.environ, gang=gang, close=close)
    state = read_state(paths)
    for section in ("firewall", "barrier"):
        if seen[section]:
            record(paths, section, **seen[section])
    record(paths, "job", started_at=started_at, pid=state["pid"], restart=p["restart"])
    extra = dict(opened, probe=probe) if probe is not None else opened
    return dict(changed=True, started=True, job_state=state["state"], pid=state["pid"],
                exit_code=state["exit_code"], cmd=argv, run_dir=paths["dir"],
                log=paths["log"], last_line=last_line(paths["log"]),
                started_at=started_at, meta=p["meta"], record=read_record(paths), **extra)


def report(paths, changed=False, **extra):
    """The job's state here, for every state of the module: the result's fields."""
    state = read_state(paths)
    meta = load_json(paths["meta"], {})
    if state["exit_code"] is not None and not meta.get("ended_at"):
        # An exit code written by stop for a supervisor that never finished.
        try:
            meta["ended_at"] = os.path.getmtime(paths["exit_code"])
        except OSError:
            pass
    return dict(changed=changed, job_state=state["state"], pid=state["pid"],
                exit_code=state["exit_code"], run_dir=paths["dir"], log=paths["log"],
                last_line=last_line(paths["log"]), meta=meta,
                started_at=meta.get("started_at"), ended_at=meta.get("ended_at"),
                checked_at=time.time(), record=read_record(paths), **extra)


def close_firewall(module, p, paths):
    """The run's rules removed here: by the supervisor already (the record says so), else now.
    What was removed, or the error, since a rule that could not be removed must not hide the
    job's own state."""
    fw = read_record(paths)["firewall"]
    if fw.get("closed_by") and not fw.get("error"):
        return {"changed": False, "closed_by": fw["closed_by"]}
    closed = close_rules(Runner(module), p["run_id"], p["firewall"])
    record(paths, "firewall", closed_by="wait", changed=bool(closed.get("changed")),
           error=closed.get("error"))
    if "error" in closed:
        module.warn(f"the rules of run {p['run_id']} could not be removed here: {closed['error']}")
    return closed


def _gang(paths):
    """The master's gang as its record has it, or None before it formed."""
    formed = read_record(paths)["gang"]
    return formed if "expected" in formed else None


def wait(module, p, paths, timeout):
    """Wait until the job ends here (with p.gang: on every node of the master's gang), the
    timeout passes or, with p.hang, the node's activity changes; the result's fields."""
    deadline = time.monotonic() + timeout
    hang = p["hang"]
    formed = None
    while True:
        left = deadline - time.monotonic()
        state = read_state(paths)["state"]
        if left <= 0 or state != "running":
            break
        if hang and _quiet_changed(paths, hang):
            break
        if p["gang"]:
            # The master alone speaks for every node only where every node joined its gang;
            # else the wait returns at once (gang_complete false), for a watch of every node.
            formed = _gang(paths)
            if formed is None:
                sleep_until_gone(paths, min(left, 0.5))
                continue
            if formed.get("joined", 0) < formed.get("expected", 1):
                break
        # Watching for a hang looks at the node's output every second (a stat or two).
        sleep_until_gone(paths, min(left, 1.0 if hang else 30.0))
    extra = {}
    if p["gang"]:
        formed = formed or _gang(paths)
        extra["gang_complete"] = bool(formed) and formed.get("joined", 0) >= formed.get("expected", 1)
        if formed and not extra["gang_complete"]:
            extra["gang_formed"] = formed
    # The gang's end: on the master, its supervisor stays until every node's launcher ended.
    while p["gang"] and extra["gang_complete"] and state != "running" and supervisor_alive(paths):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sleep_until_gone(paths, min(left, 30.0), which="supervisor")
    if p["gang"]:
        extra["gang_ended"] = (extra["gang_complete"] and state != "running"
                               and not supervisor_alive(paths))
        # The nodes the master's gang lost (their links closed without an exit): the launch
        # does not try them again.
        extra["gang_lost"] = ((_gang(paths) or {}).get("lost") or []
                              if extra["gang_ended"] else [])
        if not extra["gang_ended"]:
            state = "running"  # for the rules below: the job is not over everywhere yet
    if hang:
        last = last_activity(paths)
        extra["activity"] = {"last": last, "quiet": last is not None
                             and time.time() - last >= hang["timeout"],
                             "hung": os.path.exists(paths["hung"])}
    # Once the job has ended here, its rules go in this same call (no teardown round trip).
    if p["firewall"] is not None and state != "running" and not module.check_mode:
        closed = close_firewall(module, p, paths)
        return report(paths, changed=closed["changed"], firewall=closed, **extra)
    return report(paths, **extra)


def _quiet_changed(paths, hang):
    """Whether the wait must return for the hang watch: the node went quiet (no output for
    hang.timeout s) while the controller thinks it active, or made progress since the quiet
    spell the controller knows of (hang.quiet_since), or the job was declared hung."""
    if os.path.exists(paths["hung"]):
        return True
    last = last_activity(paths)
    if last is None:
        return False
    if hang["quiet_since"]:
        return last > hang["quiet_since"]
    return time.time() - last >= hang["timeout"]


def stop(module, p, paths):
    """Stop the job here (SIGTERM, the grace, SIGKILL): the result's fields."""
    state = read_state(paths)
    left = job_pids(paths["dir"])
    if state["state"] != "running" and not left:
        return report(paths, killed=[])
    if module.check_mode:
        return report(paths, changed=True, killed=[])
    if state["state"] == "absent" and not os.path.isdir(paths["dir"]):
        # The run did not start here: what carries its marker is the launcher preflight
        # started ahead (_warm), which goes now.
        return report(paths, changed=True, killed=dismiss(paths["dir"]))
    killed = stop_job(paths, state["pid"], p["grace"])
    record(paths, "job", stopped_at=time.time(), killed=killed)
    return report(paths, changed=True, killed=killed)


STATES = {"started": start, "waiting": lambda module, p, paths: wait(module, p, paths,
                                                                     p["wait_timeout"]),
          "stopped": stop, "status": lambda module, p, paths: report(paths)}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="status",
                       choices=["started", "status", "waiting", "stopped"]),
            run_id=dict(type="str", required=True),
            restart=dict(type="int", default=0),
            root=dict(type="path", required=True),
            python=dict(type="path", default=""),
            launcher=dict(type="str", default="torchrun",
                          choices=list(LAUNCHERS)),
            launcher_args=dict(type="list", elements="str", default=[]),
            use_cpu=dict(type="bool", default=False),
            torch_version=dict(type="str", default=""),
            script=dict(type="str"),
            args=dict(type="list", elements="str", default=[]),
            chdir=dict(type="path"),
            nnodes=dict(type="str", default="1"),
            nproc_per_node=dict(type="int", default=1),
            node_nprocs=dict(type="list", elements="int", default=[]),
            node_rank=dict(type="int", default=0),
            master_addr=dict(type="str", default="127.0.0.1"),
            master_port=dict(type="int", default=29500),
            rdzv=dict(type="str", default="static", choices=["static", "c10d"]),
            max_restarts=dict(type="int", default=0),
            rdzv_conf=dict(type="dict", default={}),
            env=dict(type="dict", default={}),
            secret_env=dict(type="dict", default={}, no_log=True),
            # Used by the action (plugins/action/torchrun_job.py), which takes it out of the
            # arguments before the module runs. A variable's name, not a secret.
            secret_env_var=dict(type="str", no_log=False),
            timeout=dict(type="int", default=0),
            wait_timeout=dict(type="float", default=5),
            grace=dict(type="float", default=10),
            meta=dict(type="dict", default={}),
            wrapper=dict(type="list", elements="str", default=[]),
            warm=dict(type="bool", default=False),
            standby=dict(type="dict", options=dict(
                delay=dict(type="float", default=0),
            )),
            container=dict(type="dict", options=dict(
                runtime=dict(type="str", required=True,
                             choices=["podman", "docker", "apptainer", "singularity"]),
                path=dict(type="path", required=True),
                image=dict(type="str", required=True),
                id=dict(type="str", default=""),
                gpus=dict(type="bool", default=False),
                volumes=dict(type="list", elements="str", default=[]),
                options=dict(type="list", elements="str", default=[]),
            )),
            barrier=dict(type="dict", options=dict(
                listen=dict(type="bool", default=False),
                expect=dict(type="int", default=1),
                timeout=dict(type="float", default=3),
                window=dict(type="float", default=20),
                source=dict(type="str", default=""),
                background=dict(type="bool", default=False),
            )),
            firewall=dict(type="dict", options=dict(RULE_OPTIONS)),
            gang=dict(type="bool", default=False),
            hang=dict(type="dict", options=dict(
                timeout=dict(type="float", required=True),
                quiet_since=dict(type="float", default=0),
            )),
        ),
        supports_check_mode=True,
    )
    p = module.params
    paths = run_paths(p["root"], p["run_id"])
    try:
        result = STATES[p["state"]](module, p, paths)
    except StartError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    except FirewallError as exc:  # the start's rules could not be opened: nothing started
        module.fail_json(msg=exc.msg, **exc.details)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
