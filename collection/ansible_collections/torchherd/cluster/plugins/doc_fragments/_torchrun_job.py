# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The options of the torchrun_job module, which outgrew the module's own file.

Private to the collection (leading underscore): free to change. Only torchrun_job extends it;
its argument spec must name the same options with the same types and defaults (ansible-test's
validate-modules compares the two).
"""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
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
  sample_every:
    description:
      - With O(state=started), seconds between two samples of the node's use while the
        launcher runs - each GPU's utilization and memory (nvidia-smi's query, which opens no
        CUDA context; none where the node has no nvidia-smi), the node's CPU and memory - kept
        in the run-state record's C(use) section (at most 240 points, merged two into one when
        full, and the last 3 samples as taken). 0 samples nothing.
    type: float
    default: 0
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
  lines:
    description:
      - With O(state=waiting), for a live view, the wait also returns once this many seconds
        passed and a node's last line of the job changed since the wait began - with O(gang),
        any node's of the gang (RV(nodes)), else this node's own (RV(last_line) the log's last
        line); it looks four times a second. 0 waits for the job's end or O(wait_timeout)
        alone.
    type: float
    default: 0
  meta:
    description: Extra facts recorded in C(meta.json) (host, node_rank, name); returned by status.
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
          connection (the master may listen a moment after a node first tries) or one that
          O(barrier.timeout) left unanswered (the master's firewall rules, where its start
          opens them, may come a moment after a node first tries).
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
