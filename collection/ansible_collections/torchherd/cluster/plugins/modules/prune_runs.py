#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: prune_runs
author: torchherd developers (!UNKNOWN)
version_added: 0.2.0
short_description: Remove the run directories of ended runs on one node
description:
  - Removes the node's run directory (C(<root>/runs/<run_id>), with the job's logs, pid and
    exit code files, run-state record and Flight Recorder dumps) of each run named, unless its
    job still runs there. Whether it runs is read as O(torchherd.cluster.torchrun_job#module:state=status)
    reads it (the pid file, the job's processes, the supervisor); a run whose job runs is kept.
  - The code directory (C(<root>/code/<name>)) is not touched; every run of a job of the same
    name shares it, and the next launch's sync sends only what changed into it.
extends_documentation_fragment:
  - torchherd.cluster._attributes
attributes:
  check_mode:
    support: full
    details: Nothing is removed; RV(runs) says what would be, and its size.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: A second call finds the directories gone and changes nothing.
options:
  runs:
    description: The runs to remove, each with its C(run_id) and the node's C(root).
    type: list
    elements: dict
    required: true
    suboptions:
      run_id:
        description: Run id.
        type: str
        required: true
      root:
        description: torchherd's directory on the node (the run's plan says which).
        type: path
        required: true
"""

EXAMPLES = r"""
- name: Remove two ended runs
  torchherd.cluster.prune_runs:
    runs:
      - run_id: 20261120-101500-3fa2
        root: ~/.torchherd
      - run_id: 20261121-093000-77c1
        root: ~/.torchherd
  register: pruned
"""

RETURN = r"""
runs:
  description:
    - Run id to what was found and done; C(state) is the job's state on the node (C(absent)
      where the run directory holds no job, C(missing) where there is no run directory),
      C(removed) whether the directory was removed (in check mode, whether it would be),
      C(bytes) and C(files) its size, C(error) why it could not be removed (or null).
  returned: always
  type: dict
  sample:
    20261120-101500-3fa2:
      dir: /home/me/.torchherd/runs/20261120-101500-3fa2
      state: succeeded
      removed: true
      bytes: 48213
      files: 11
      error: null
"""

import os
import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchherd.cluster.plugins.module_utils._exit import skip_last_collection
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    read_state,
    run_paths,
)


def size_of(top):
    """(bytes, files) under a directory, symlinks counted as themselves, never followed."""
    total, count = 0, 0
    for dirpath, _dirnames, filenames in os.walk(top):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
            count += 1
    return total, count


def prune_one(root, run_id, check_mode):
    paths = run_paths(root, run_id)
    entry = {"dir": paths["dir"], "state": "missing", "removed": False, "bytes": 0,
             "files": 0, "error": None}
    if not os.path.isdir(paths["dir"]):
        return entry
    entry["state"] = read_state(paths)["state"]
    entry["bytes"], entry["files"] = size_of(paths["dir"])
    if entry["state"] == "running":
        return entry
    if not check_mode:
        try:
            shutil.rmtree(paths["dir"])
        except OSError as exc:
            entry["error"] = f"{exc.strerror or exc}: {exc.filename or paths['dir']}"
            return entry
    entry["removed"] = True
    return entry


def main():
    skip_last_collection()
    module = AnsibleModule(
        argument_spec=dict(
            runs=dict(type="list", elements="dict", required=True, options=dict(
                run_id=dict(type="str", required=True),
                root=dict(type="path", required=True),
            )),
        ),
        supports_check_mode=True,
    )
    # Every run id checked before anything is removed: a bad one fails the task with nothing
    # gone, never halfway.
    for run in module.params["runs"]:
        if os.sep in run["run_id"] or run["run_id"] in ("", ".", ".."):
            module.fail_json(msg=f"run_id {run['run_id']!r}: expected a run id, found a path")
    found = {}
    for run in module.params["runs"]:
        found[run["run_id"]] = prune_one(run["root"], run["run_id"], module.check_mode)
    changed = any(e["removed"] for e in found.values())
    module.exit_json(changed=changed, runs=found)


if __name__ == "__main__":
    main()
