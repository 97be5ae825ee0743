#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: run_record
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: Claim a run directory on the controller and write records into it
description:
  - Creates the run's directory on the controller and writes files into it (C(plan.json),
    C(preflight.json)), each replaced atomically, mode 0644, and the time a phase of the launch
    ended (O(mark), into C(marks.json)).
  - With O(claim=true) it refuses a run directory that already holds a C(plan.json), since a run id
    names one run.
  - Runs in the controller's own process, whatever host the task is for; no module is sent
    anywhere. This is an action plugin; this file only documents it.
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.ACTION
attributes:
  check_mode:
    support: full
    details: Nothing is written; RV(files) lists what would be.
  action:
    details: The action writes on the controller, in its own process; there is no module to run.
  diff_mode:
    support: none
  idempotent:
    support: none
    details: Every call rewrites the files; a second claim of the same run directory fails.
options:
  run_dir:
    description: The run's directory on the controller.
    type: path
    required: true
  claim:
    description: Fail when O(run_dir) already holds a C(plan.json) (a run id used before).
    type: bool
    default: false
  files:
    description: File names relative to O(run_dir) and their text content.
    type: dict
    default: {}
  mark:
    description:
      - The name of a phase of the launch that ends now (C(plan), C(preflight), C(watch),
        C(collect)). Its time (RV(written_at)) is added to C(marks.json) in O(run_dir), the marks
        there before kept; M(torchherd.cluster.run_summary) takes the phases' timings from it.
      - Empty records no mark.
    type: str
    default: ""
    version_added: 0.3.0
"""

EXAMPLES = r"""
- name: Claim the run id and record the plan
  torchherd.cluster.run_record:
    run_dir: "runs/{{ run_id }}"
    claim: true
    files:
      plan.json: "{{ plan | to_nice_json }}"
"""

RETURN = r"""
run_dir:
  description: Absolute path of the run directory.
  returned: always
  type: str
  sample: /home/me/project/runs/20261121-101500-3fa2
files:
  description: Paths written (C(marks.json) last, where O(mark) is given).
  returned: always
  type: list
  elements: str
  sample: [/home/me/project/runs/20261121-101500-3fa2/plan.json]
written_at:
  description: When the files were written, in seconds since the epoch (the controller's clock).
  returned: always
  type: float
  sample: 1795734221.87
"""
