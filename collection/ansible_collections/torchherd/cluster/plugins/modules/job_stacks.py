#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: job_stacks
author: torchherd developers (!UNKNOWN)
version_added: 0.2.0
short_description: Read the Python stack of every process of a job on one node
description:
  - Finds the job's processes on this node by the run's marker in their environment (as stop
    does), tells each one's C(RANK) and C(LOCAL_RANK) from its environment, and reads every
    thread's Python stack with C(py-spy dump --nonblocking), which neither stops nor changes
    the process. The job goes on running.
  - py-spy must be installed on the node, next to the job's interpreter (a venv's C(bin)) or on
    C(PATH) (C(pip install py-spy)). It reads another process's memory, which the kernel allows
    for the process's own user unless C(kernel.yama.ptrace_scope) is 1 or more (then root).
  - Where a rank runs NCCL with a Flight Recorder pipe (C(TORCH_NCCL_DEBUG_INFO_PIPE_FILE), which
    the collection's start sets up for NCCL jobs), the rank is asked for its dump through the
    pipe; the dumps land in the run directory's C(flight_recorder/) (collect brings them back).
  - Where a rank runs NCCL with its RAS service on (NCCL 2.24 and later, on unless
    C(NCCL_RAS_ENABLE=0)), NCCL's status of the job is asked for as C(ncclras) asks for it, on
    the address from the rank's environment (C(NCCL_RAS_ADDR), else C(localhost:28028)) - which
    ranks of which communicator have not joined, are behind in their collectives or are dead.
    RAS answers from a thread of its own, also while the rank's other threads are stuck.
  - With O(mark_hung), writes the run's C(hung) file first, which ends every node's hang watch,
    and the declared hang into the node's run record (its C(hang) section).
extends_documentation_fragment:
  - torchherd.cluster._attributes
attributes:
  check_mode:
    support: full
    details: In check mode nothing is read or written; the processes are listed.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: Reading stacks changes nothing; O(mark_hung) writes the same file again.
options:
  run_id:
    description: Run id of the job.
    type: str
    required: true
  root:
    description: torchherd's directory on the node; the run lives in C(<root>/runs/<run_id>).
    type: path
    required: true
  python:
    description: The job's interpreter; py-spy is looked for next to it first.
    type: path
    default: ""
  mark_hung:
    description: Write the run's C(hung) file and the record's C(hang.declared_at) (the job was
      declared hung).
    type: bool
    default: false
  flight_recorder_wait:
    description: Seconds to wait for the Flight Recorder dumps asked for.
    type: float
    default: 10
"""

EXAMPLES = r"""
- name: Read every rank's stack on this node
  torchherd.cluster.job_stacks:
    run_id: demo-1
    root: ~/.torchherd
  register: stacks
"""

RETURN = r"""
processes:
  description:
    - The job's processes here, each with C(pid), C(rank) and C(local_rank) (null for the
      launcher), C(role) (C(rank), C(child) for a process a rank started, such as a data loader
      worker, C(launcher)), C(cmdline), C(pipe) (its Flight Recorder pipe's prefix), C(dump),
      C(ras) (where its NCCL's RAS answers, null for none), C(threads), C(error) and C(fix)
      (how to fix C(error) where known, the same for every rank of a node).
    - A thread has C(thread_id), C(name), C(main) (the process's main thread), C(active) and
      C(frames), innermost first, each with C(name) (the function), C(file) and C(line).
  returned: always
  type: list
  elements: dict
  sample:
    - pid: 4242
      rank: 3
      local_rank: 1
      role: rank
      cmdline: [/usr/bin/python3, -u, train.py]
      error: null
      fix: null
      threads:
        - {thread_id: 4242, name: MainThread, main: true, active: false,
           frames: [{name: stall, file: /root/code/train.py, line: 12}]}
flight_recorder:
  description: Rank to the path of its Flight Recorder dump on this node (NCCL ranks only).
  returned: always
  type: dict
  sample: {"3": /root/.torchherd/runs/demo-1/flight_recorder/rank_3}
flight_recorder_missing:
  description: Ranks asked for a Flight Recorder dump that wrote none in time.
  returned: always
  type: list
  elements: int
  sample: []
nccl_ras:
  description:
    - NCCL's own view of the job's communicators from its RAS service (NCCL 2.24 and later),
      asked on the port the node's NCCL ranks use (C(NCCL_RAS_ADDR), by default
      C(localhost:28028)) - C(address), C(text) (its status report), C(findings) (the lines of
      its C(Errors) and C(Warnings) sections - ranks missing, behind in their collectives, dead)
      and C(error) (why there is no answer - an older NCCL, RAS off, no communicator yet).
    - Null where no process here is an NCCL rank with RAS on.
  returned: always
  type: dict
  sample: {address: "localhost:28028", error: null, text: "...",
           findings: {Warnings: ["#0-1 (ab12cd...) MISMATCH", "  Communicator ranks have ..."]}}
error:
  description: Why no stack could be read here (no py-spy); null otherwise.
  returned: always
  type: str
  sample: null
fix:
  description: How to fix RV(error) (install py-spy, with the command), apart from it so that a
    report over many nodes says one fix once; null where there is none.
  returned: always
  type: str
  sample: /opt/venv/bin/python -m pip install py-spy into the job's environment on every node (a static binary, no build)
checked_at:
  description: The node's time when the stacks were read.
  returned: always
  type: float
  sample: 1795499931.9
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchherd.cluster.plugins.module_utils._exit import skip_last_collection
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import run_paths
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import note_hang
from ansible_collections.torchherd.cluster.plugins.module_utils._stacks import (
    StacksError,
    collect,
    nccl_ras,
    processes,
)


def main():
    skip_last_collection()
    module = AnsibleModule(
        argument_spec=dict(
            run_id=dict(type="str", required=True),
            root=dict(type="path", required=True),
            python=dict(type="path", default=""),
            mark_hung=dict(type="bool", default=False),
            flight_recorder_wait=dict(type="float", default=10),
        ),
        supports_check_mode=True,
    )
    p = module.params
    paths = run_paths(p["root"], p["run_id"])
    if module.check_mode:
        module.exit_json(changed=False, processes=processes(paths["dir"]), flight_recorder={},
                         flight_recorder_missing=[], nccl_ras=None, error=None, fix=None,
                         checked_at=time.time())
    changed = False
    if p["mark_hung"] and os.path.isdir(paths["dir"]):
        # The declared hang into the record too (its hang section), the hung file first.
        note_hang(paths, declared_at=time.time())
        changed = True
    try:
        found = collect(paths["dir"], p["python"], p["flight_recorder_wait"])
    except StacksError as exc:
        procs = processes(paths["dir"])
        module.exit_json(changed=changed, processes=procs, flight_recorder={},
                         flight_recorder_missing=[], nccl_ras=nccl_ras(procs), error=str(exc),
                         fix=exc.fix, checked_at=time.time())
    module.exit_json(changed=changed, error=None, fix=None, checked_at=time.time(), **found)


if __name__ == "__main__":
    main()
