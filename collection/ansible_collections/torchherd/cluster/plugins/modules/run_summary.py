#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: run_summary
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: Write summary.json of a run on the controller
description:
  - Runs on the controller once the nodes' run directories were fetched into
    O(run_dir)C(/nodes/<host>/).
  - Per host it records the node rank, the job state and exit code, and for a failed node the
    failing global rank, the exception and its traceback, read from torchelastic's error files
    or, when the script did not use C(@record), from the rank's own stderr log.
  - Writes O(run_dir)C(/summary.json) and returns it with a per-node table for people.
  - Writes O(run_dir)C(/merged.log), every node's log with each line prefixed by the host and the
    global rank (C(r5)), the local rank for elastic runs (C(l1)), or C(agent) for torchrun's own lines.
  - Runs in the controller's own process, whatever host the task is for; no module is sent
    anywhere. This is an action plugin; this file only documents it.
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.ACTION
attributes:
  action:
    details: The action writes on the controller, in its own process; there is no module to run.
  check_mode:
    support: none
  diff_mode:
    support: none
  idempotent:
    support: none
    details: Every call rewrites C(summary.json) (with a new C(written_at)) and C(merged.log), and
      reports a change.
options:
  run_dir:
    description: The run's directory on the controller.
    type: path
    required: true
  plan:
    description:
      - The run's plan (C(torchherd_plan)). The summary hides its secret values (as filter
        C(torchherd.cluster.redact) does) and shows what preflight resolved on the nodes in
        place of what the job asked, from the verdict in C(preflight.json) of O(run_dir)
        (C(nproc_per_node), C(world_size), C(nprocs), the master's port, C(interfaces),
        C(interconnect) and C(preflight_warnings)).
    type: dict
    required: true
  results:
    description: Per-host results from C(torchherd.cluster.node_results).
    type: dict
    required: true
  marks:
    description: Phase name to the Unix time it ended (plan, preflight, sync, start, watch,
      collect), over those the launch recorded in the run directory's C(marks.json)
      (M(torchherd.cluster.run_record)'s O(torchherd.cluster.run_record#module:mark)).
    type: dict
    default: {}
  not_asked:
    description:
      - The run's nodes that ansible-playbook's limit (C(--limit)) kept out of reach. No task
        asked them, so the entries an earlier summary wrote for them stand; a node with none
        is C(unknown).
    type: list
    elements: str
    default: []
  mark:
    description:
      - The phase of the launch that ends as the summary begins (C(collect) for a launch, with
        the teardown of the rules left in place). Its time goes into the run
        directory's C(marks.json) first, as M(torchherd.cluster.run_record)'s
        O(torchherd.cluster.run_record#module:mark) does, so that the launch needs no task of
        its own for it.
      - Empty (status, stop, collect) records no mark.
    type: str
    default: ""
    version_added: 0.3.0
"""

EXAMPLES = r"""
- name: Write summary.json
  torchherd.cluster.run_summary:
    run_dir: runs/demo-1
    plan: "{{ torchherd_plan }}"
    results: "{{ torchherd_plan.nodes | map(attribute='host') | torchherd.cluster.node_results(hostvars) }}"
  delegate_to: localhost
"""

RETURN = r"""
summary:
  description: The content of summary.json.
  returned: always
  type: dict
  sample:
    run_id: demo-1
    state: failed
    reason: "node node1 (node_rank 1) rank 3: RuntimeError: boom"
    hosts:
      node1:
        node_rank: 1
        state: failed
        exit_code: 1
        failing_rank: 3
        exception: "RuntimeError: boom"
table:
  description: The per-node result as text, one line per node and a last line for the run.
  returned: always
  type: str
  sample: |-
    node   rank  state   exit  logs  last line / error
    node1  1     failed  1     yes   RuntimeError: boom
    run demo-1: failed (node node1 (node_rank 1) rank 3: RuntimeError: boom)
path:
  description: Path of the C(summary.json) written.
  returned: always
  type: str
  sample: /home/me/project/runs/demo-1/summary.json
"""
