#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: plan_run
author: torchherd developers (!UNKNOWN)
version_added: 0.3.0
short_description: Plan a run on the controller - the plan, the code's hash, the schedule and the run directory
description:
  - The plan phase of every playbook that starts a run (launch, verify), in one task on the
    controller. It computes the plan from the job and the inventory (filter
    C(torchherd.cluster.plan), which lists every problem of the job and refuses it before any
    node is touched), hashes the job's code under C(code_src) as the sync will send it (as
    M(torchherd.cluster.code_hash) does; nothing for a job without a script), decides how the
    launch runs (filter C(torchherd.cluster.schedule)), and claims the run id.
  - It refuses too few forks for the tasks the schedule runs on every node at once, and a script
    that is not part of the code the sync sends (its path, or the ignore rule that leaves it
    out).
  - The run id is the job's C(run_id), else a new one, the UTC time and four random hex digits
    (C(20261121-101500-3fa2)). The run's directory C(<runs_dir>/<run_id>) must not hold a
    C(plan.json) yet (a run id names one run); C(plan.json) (the plan, the code's hash and its
    number of files), C(schedule.json) and the plan's end in C(marks.json) are written there, as
    M(torchherd.cluster.run_record) writes them.
  - C(runs_dir) and C(code_src) of the job become absolute paths (C(~) expanded, links resolved)
    against the controller's working directory.
  - The job is read from the variable O(job_var) and templated in the action, so that no task
    argument holds its secret values (callbacks see every task's arguments).
  - Runs in the controller's own process (ansible-playbook's worker); no module is sent
    anywhere. This is an action plugin; this file only documents it.
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.ACTION
attributes:
  check_mode:
    support: full
    details: Plans, hashes and checks; writes nothing (RV(files) lists what would be written).
  action:
    details: The action plans and writes on the controller, in its own process; there is no
      module to run.
  diff_mode:
    support: none
  idempotent:
    support: none
    details: Every call plans a new run; a second claim of the same run id fails.
options:
  job_var:
    description: The variable that holds the job (the spec of the C(torchherd.cluster.plan)
      role's C(torchherd_job)).
    type: str
    default: torchherd_job
  playbook:
    description: The playbook the plan is for (C(launch), C(verify)); the plan and the schedule
      decide from it what must run.
    type: str
    default: launch
  exclude:
    description: Nodes the driver's restart leaves out, by name, with why.
    type: dict
    default: {}
  limit:
    description: ansible-playbook's C(--limit) as given (C(ansible_limit)); empty where none.
    type: str
    default: ""
  limit_hosts:
    description: The hosts O(limit) matches; a node outside them is none of the plan's. Omitted
      where there is no limit.
    type: list
    elements: str
  restart:
    description: The whole-job restart this launch is (0 for the first).
    type: int
    default: 0
  launched_at:
    description: When the driver started the launch (seconds since the epoch), for the
      summary's timings; omitted where ansible-playbook runs on its own.
    type: float
  forks:
    description: ansible-playbook's forks (C(ansible_forks)).
    type: int
    required: true
  progress_every:
    description: How often a live view wants word of the running job, in seconds; 0 for none
      (the schedule's C(watch)).
    type: raw
    default: 0
"""

EXAMPLES = r"""
- name: Plan the run
  torchherd.cluster.plan_run:
    job_var: torchherd_job
    playbook: launch
    forks: "{{ ansible_forks | int }}"
  register: planned
"""

RETURN = r"""
plan:
  description: The plan (see filter C(torchherd.cluster.plan)), with C(started_at),
    C(restart) and C(launched_at), C(job.runs_dir) and C(job.code_src) absolute.
  returned: always
  type: dict
schedule:
  description: How the launch runs (see filter C(torchherd.cluster.schedule)).
  returned: always
  type: dict
code:
  description: The job's code as the sync sends it, as M(torchherd.cluster.code_hash) returns
    it with O(torchherd.cluster.code_hash#module:return_files) - C(hash), C(count), C(files),
    C(left_out); empty for a job without a script.
  returned: always
  type: dict
run_dir:
  description: Absolute path of the run directory.
  returned: always
  type: str
  sample: /home/me/project/runs/20261121-101500-3fa2
files:
  description: Paths written (C(marks.json) last).
  returned: always
  type: list
  elements: str
prior:
  description:
    - Where the schedule has each node's start come with its facts call (C(start.with_facts)),
      the last launch of the same job on the same nodes whose preflight passed - C(run_id),
      C(gate) (what of its verdict the starts are computed from), C(facts) and C(expect) (what
      each node's fresh facts must be, node_facts' O(torchherd.cluster.node_facts#module:start_expect)),
      by host; null elsewhere.
    - Each launch of the playbook C(launch) (not in check mode) leaves a pointer to itself under
      the hash of its job in the runs directory (C(.relaunch/)), which the next launch of the
      same job follows.
  returned: always
  type: dict
"""
