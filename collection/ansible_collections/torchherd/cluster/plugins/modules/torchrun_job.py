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
    of this module); a second failure returns RV(lost) with C(unreachable). With O(firewall),
    once the job has ended on this node, the same call removes the run's rules.
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
  - torchherd.cluster._torchrun_job
  - torchherd.cluster._node_values.SPREAD
attributes:
  action:
    details:
      - The module runs on the node. The action spreads O(arguments) into the module's other
        arguments, adds the secret values that O(secret_env_var) names to them, asks once more on a fresh connection when a wait cannot
        reach the node, keeps the controller's side of the hang watch (O(hang)) and adds
        RV(received_at) to every answer.
  check_mode:
    support: partial
    details:
      - A start reports a change and the rules it would open (RV(firewall)), and neither opens
        them, nor meets at the barrier, nor starts anything; a stop reports a change where
        something of the job is left.
      - A wait removes none of the run's rules and reports no change, also where it would remove
        them (O(firewall)).
  diff_mode:
    support: none
  idempotent:
    support: partial
    details:
      - A second start of the same run id fails (a run id starts once, and its run directory
        is there) unless it is a restart (O(restart)) of a job that ended.
      - Status changes nothing.
      - A wait changes the node only with O(firewall), once the job has ended there - it removes
        the run's rules where the job's supervisor has not and writes that (or why it could
        not) to the run-state record; a second wait then reports no change, unless the removal
        failed and it tries again. With O(hang), a wait also writes what the node said to the
        hang watch into the record's C(hang) section (and reports no change for it).
      - With O(hang), the action writes what the node said to the hang watch's files on the
        controller, and the first wait that finds every node quiet declares the job hung.
      - Stopping a stopped job changes nothing.
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
nodes:
  description:
    - With O(gang), every node's last line of the job as the master's gang heard it, by the
      node's name (its inventory name), this node's own among them - C(last_line), the job's
      own words (a rank's line where one printed; not the launcher's banner, nor warnings and
      log lines of torch, the launcher or the supervisor), and C(at), when the master heard it
      (this node's clock). Each node says its line when it changed, at most once a second.
    - C(use), where the node's use is sampled (O(sample_every)), the cell of its last sample -
      its GPUs' mean utilization and its fullest GPU's memory (C(gpu 97% 39.3G)), else its CPU
      and memory (C(cpu 42% 3.0G)); said when it changed, at most once a second. C(gpu_util),
      its GPUs' mean utilization (null without GPUs), and C(idle_for), where its GPUs sat below
      5% while another node's were at 30% or more for 15 s or longer - the seconds of that spell.
    - Empty where no node of the gang said a line or its use yet. A node whose use came before
      its first line (its ranks still importing, say) has an empty C(last_line) and a null C(at).
  returned: with O(gang)
  type: dict
  sample: {"node0": {"last_line": "[default0]:step 40 loss 0.61", "at": 1763700009.8},
           "node1": {"last_line": "[default0]:step 40 loss 0.60", "at": 1763700009.4}}
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
      C(gang) (on the master, C(joined), C(expected), C(lost), C(lines) - see RV(nodes)),
      C(firewall) (C(opened_by),
      C(rules); C(closed_by), C(error)), C(hang) (the hang watch's word - C(timeout),
      C(quiet_since), C(last), C(quiet), C(quiet_for), C(noted_at); C(declared_at) once the job
      was declared hung), C(use) (the samples of the node's use where O(sample_every) is set -
      C(every), C(gpus), C(recent) (the last samples as taken) and C(stats) (per GPU its mean
      utilization and peak memory, the node's mean CPU and peak memory); the record on the
      node keeps the C(points) of the whole course, which this answer leaves out).
  returned: except with O(state=started) in check mode or where the start failed
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchherd.cluster.plugins.module_utils._exit import skip_last_collection
from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import FirewallError
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl import act
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.spec import ARGUMENT_SPEC
from ansible_collections.torchherd.cluster.plugins.module_utils._starterror import StartError


def main():
    skip_last_collection()
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        supports_check_mode=True,
    )
    try:
        result = act(module, module.params)
    except StartError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    except FirewallError as exc:  # the start's rules could not be opened: nothing started
        module.fail_json(msg=exc.msg, **exc.details)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
