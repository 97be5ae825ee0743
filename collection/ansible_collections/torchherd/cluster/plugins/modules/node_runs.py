#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: node_runs
author: torchherd developers (!UNKNOWN)
version_added: 0.2.0
short_description: The torchherd runs on one node and the GPU processes that are none of theirs
description:
  - Finds the torchherd runs on the node from its processes - each job's processes carry their
    run directory in their environment (C(TORCHHERD_RUN)), as preflight's stale-job check finds
    them - so that the runs of every user, every controller and every torchherd root show, and
    describes each from its run directory (the run-state record's job section and the run's
    C(meta.json), as O(torchherd.cluster.torchrun_job#module:state=status) reads them).
  - Lists the processes holding a GPU (C(nvidia-smi --query-compute-apps), as preflight's busy-GPU
    check reads them) that belong to none of those runs.
  - The kernel shows a process's environment to its own user and to root only; run it as root
    (become) to see the runs of other users.
  - A run whose processes live in another mount namespace and whose run directory is not on this
    node's file system is a container's on the same machine (a node of its own, which answers
    for it) and is left out.
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.INFO_MODULE
options: {}
"""

EXAMPLES = r"""
- name: Who uses the node
  torchherd.cluster.node_runs:
  register: torchherd_ps
"""

RETURN = r"""
runs:
  description:
    - The runs with live processes on the node, each with C(run_id), C(run_dir), C(name) (the
      job's, null for a run of a version that did not record it), C(host) and C(node_rank) (as
      the run's plan named this node), C(user) (whom its processes run as), C(started_at) (the
      node's clock), C(state), C(job_state) (the record's word - C(running), C(succeeded),
      C(failed), C(stopped), C(timed_out), C(standby), C(lost), C(absent)), C(exit_code), C(pids),
      C(gpus) (the indices of the GPUs its processes hold; null without nvidia-smi) and
      C(gpu_memory_bytes) (what they hold there, null where nvidia-smi does not say).
    - C(state) is C(running) (its supervisor watches it), C(stale) (its processes outlived the
      job's end, or its supervisor is gone), or C(starting) (no launcher in the record yet).
  returned: always
  type: list
  elements: dict
  sample:
    - run_id: 20261128-101500-3fa2
      run_dir: /home/ana/.torchherd/runs/20261128-101500-3fa2
      name: train
      host: gpu01
      node_rank: 0
      user: ana
      started_at: 1795860900.5
      state: running
      job_state: running
      exit_code: null
      pids: [4242, 4250, 4251]
      gpus: [0, 1]
      gpu_memory_bytes: 34359738368
gpu_processes:
  description:
    - The processes holding a GPU that are no torchherd run's, each with C(pid), C(user) (null
      where the node's C(/proc) does not show the process, as for another container's), C(gpu)
      (its index), C(used_memory_bytes) and C(name); null where nvidia-smi is not there to say.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 777, user: bob, gpu: 3, used_memory_bytes: 1048576000, name: python3}]
sees_all:
  description: Whether the module ran as root, which reads every process's environment; else
    the runs of other users do not show.
  returned: always
  type: bool
  sample: true
"""

import traceback

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchherd.cluster.plugins.module_utils._exit import skip_last_collection
from ansible_collections.torchherd.cluster.plugins.module_utils._noderuns import node_runs


def main():
    skip_last_collection()
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    try:
        found = node_runs()
    except OSError as exc:
        module.fail_json(msg=f"reading the node's runs: {exc}", exception=traceback.format_exc())
    module.exit_json(changed=False, **found)


if __name__ == "__main__":
    main()
