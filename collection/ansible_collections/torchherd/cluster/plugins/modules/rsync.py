#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: rsync
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: Copy a directory between the controller and a node with rsync
description:
  - Runs rsync on the controller, through the same SSH settings, and the same persistent
    connection, that Ansible uses for the node (user, port, key, common args, ControlPath).
    With the C(local) connection it copies on this machine.
  - O(direction=push) copies code to the node (only what changed, by rsync's delta transfer);
    O(direction=pull) brings logs and artifacts back.
  - Needs rsync on the controller and on the node, and key-based SSH (no password prompts).
  - Under become to another user than the SSH user (C(become_user), the driver's C(-b)
    C(--become-user)), the node's side runs as that user through C(sudo -n) and a leading C(~)
    is that user's home, as the modules see it; sudo must let the SSH user run rsync without a
    password (the copy fails with sudo's words otherwise). Other become methods are refused.
  - This is an action plugin; this file only documents it.
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.ACTION
attributes:
  check_mode:
    support: full
    details: rsync runs with C(--dry-run) and RV(changes) lists what it would copy.
  action:
    details: The action runs rsync on the controller; there is no module to run on the node.
  diff_mode:
    support: none
  idempotent:
    support: full
    details: A second push of unchanged content transfers nothing and reports no change.
options:
  src:
    description: Source directory (on the controller for push, on the node for pull); its content is copied.
    type: str
    required: true
  dest:
    description: Destination directory (on the node for push, on the controller for pull); created if missing.
    type: str
    required: true
  direction:
    description: C(push) copies to the node, C(pull) copies from it.
    type: str
    choices: [push, pull]
    default: push
  excludes:
    description: rsync exclude patterns.
    type: list
    elements: str
    default: []
  includes:
    description: rsync include patterns, applied before O(excludes); with O(only_included) only these are copied.
    type: list
    elements: str
    default: []
  only_included:
    description: Copy only what O(includes) names (directories are traversed).
    type: bool
    default: false
  delete:
    description: Delete files in O(dest) that are not in O(src) (excluded files are kept).
    type: bool
    default: false
  checksum:
    description: Compare by checksum instead of size and modification time.
    type: bool
    default: false
  files:
    description: Copy exactly these paths, relative to O(src) (rsync C(--files-from)); empty means the whole tree.
    type: list
    elements: str
    default: []
  expect_hash:
    description:
      - After a push, hash O(files) on the node with C(torchherd.cluster.code_hash) and fail
        unless the hash equals this one (the controller's).
    type: str
    default: ""
  mark:
    description:
      - Record, on the controller, that a phase of a run ended as this copy began. O(mark.phase)
        goes with the time now into the C(marks.json) of O(mark.run_dir), unless a time is
        recorded for it already (where every node's copy begins at once, the first one's
        counts). A launch's collect marks the end of its watch so, without a task of its own.
      - Not written in check mode.
    type: dict
    suboptions:
      run_dir:
        description: The run's directory on the controller.
        type: str
        required: true
      phase:
        description: The phase that ended, as the run's summary names it (C(watch)).
        type: str
        required: true
"""

EXAMPLES = r"""
- name: Push the code
  torchherd.cluster.rsync:
    src: ./
    dest: /var/tmp/torchherd/code/train
    excludes: [.git, .venv]

- name: Pull the run directory back
  torchherd.cluster.rsync:
    direction: pull
    src: /var/tmp/torchherd/runs/demo-1
    dest: runs/demo-1/nodes/node0
"""

RETURN = r"""
changes:
  description: rsync's itemized changes, one per line (at most 200).
  returned: always
  type: list
  elements: str
  sample: [">f+++++++++ train.py"]
count:
  description: Number of itemized changes.
  returned: always
  type: int
  sample: 1
transferred_files:
  description: Files rsync transferred (its C(--stats) "Number of regular files transferred").
  returned: always
  type: int
  sample: 3
transferred_bytes:
  description: Bytes that went over the wire (rsync's C(--stats) "Total bytes sent" on a push, "received" on a pull).
  returned: always
  type: int
  sample: 11041
hash:
  description: The code hash found on the node.
  returned: when O(expect_hash) is set
  type: str
  sample: 9f2c1e...
ended_at:
  description: When the copy (and its hash check) was done, in seconds since the epoch on the controller's clock.
  returned: success
  type: float
  sample: 1795756492.91
cmd:
  description: The rsync command line (SSH options included), as an argv list.
  returned: always
  type: list
  elements: str
  sample: [rsync, -rlptD, --itemize-changes, "--out-format=%i %n%L", --stats, /home/me/train/, "node0:/var/tmp/torchherd/code/train/"]
"""
