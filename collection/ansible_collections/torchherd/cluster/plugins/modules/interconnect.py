#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: interconnect
author: torchherd developers (!UNKNOWN)
version_added: 0.2.0
short_description: Measure the all-reduce bus bandwidth and latency between the job's nodes
description:
  - Run on every node of a job in one task. Each node starts its share of the ranks with the
    job's interpreter (O(python)), and the ranks form one process group with the job's backend
    (gloo on CPU, NCCL on GPU) through C(tcp://)O(master_addr):O(master_port), as the job will.
  - The ranks time an all-reduce of one float (RV(allreduce.latency_us)) and of O(bytes)
    (RV(allreduce.busbw), bus bandwidth as nccl-tests defines it, algorithm bandwidth times
    2(n-1)/n). Then, unless O(pairs=false), the first process of every node exchanges
    O(pair_bytes) both ways with every other node's, in rounds where each node meets one
    other, and reports each exchange in RV(pairs); a node whose own link is slow is slow with
    every peer, a bad link between two nodes with one.
  - torch only, no MPI and no nccl-tests build. A slow link cannot make it take minutes, the
    all-reduces stop after O(budget) seconds; a node that does not join ends it after
    O(timeout) seconds on every node.
  - The judgement (a threshold, the node or link to blame) is the gate's
    (M(torchherd.cluster.gate) via the interconnect module utils), on the controller, with every
    node's result at hand.
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.INFO_MODULE
options:
  python:
    description: The job's interpreter on this node; it must import torch. Empty means the one
      running this module.
    type: path
    default: ""
  master_addr:
    description: Address of the master node, as every node reaches it.
    type: str
    required: true
  master_port:
    description: Port the master's first rank listens on while the group forms (free before the
      job starts, e.g. the job's master port).
    type: int
    required: true
  node_rank:
    description: This node's index in O(node_procs).
    type: int
    required: true
  node_procs:
    description: Processes of every node, in node order (1 per node with gloo; one per GPU with
      NCCL). The world is their sum.
    type: list
    elements: int
    required: true
  backend:
    description: The collective backend.
    type: str
    choices: [gloo, nccl]
    default: gloo
  interface:
    description: Interface of the job's traffic on this node, exported as GLOO_SOCKET_IFNAME and
      NCCL_SOCKET_IFNAME; empty leaves the choice to the backend.
    type: str
    default: ""
  bytes:
    description: Size of the all-reduce whose bandwidth is measured.
    type: int
    default: 8388608
  iterations:
    description: Timed all-reduces of O(bytes) after a warm-up (fewer once O(budget) is spent);
      the median counts.
    type: int
    default: 5
  latency_iterations:
    description: Timed all-reduces of one float for the latency; the median counts.
    type: int
    default: 20
  pairs:
    description: Measure every pair of nodes as well (node count - 1 rounds).
    type: bool
    default: true
  pair_bytes:
    description: Bytes each node of a pair sends the other in one exchange.
    type: int
    default: 4194304
  pair_iterations:
    description: Timed exchanges per pair after a warm-up; the median counts.
    type: int
    default: 3
  budget:
    description: Seconds after which the all-reduces of one size stop, however few ran.
    type: float
    default: 5
  timeout:
    description: Seconds the group may take to form and every collective may wait for a peer;
      the whole check on this node ends after twice this at most.
    type: float
    default: 60
"""

EXAMPLES = r"""
- name: Measure the interconnect from every node at once
  torchherd.cluster.interconnect:
    python: /opt/venv/bin/python
    master_addr: 10.0.0.1
    master_port: 29500
    node_rank: "{{ ansible_play_hosts.index(inventory_hostname) }}"
    node_procs: "{{ [1] * (ansible_play_hosts | length) }}"
    backend: gloo
  register: interconnect
"""

RETURN = r"""
allreduce:
  description: What this node's first rank measured; null when it failed (see RV(error)).
  returned: always
  type: dict
  contains:
    busbw:
      description: Bus bandwidth in GB/s (1e9 bytes per second).
      type: float
    algbw:
      description: Algorithm bandwidth, O(bytes) over the median time, in GB/s.
      type: float
    latency_us:
      description: Median time of an all-reduce of one float, in microseconds.
      type: float
    bytes:
      description: Size of the all-reduce measured.
      type: int
    iterations:
      description: Timed all-reduces of that size.
      type: int
    world_size:
      description: Ranks that took part.
      type: int
  sample: {busbw: 0.44, algbw: 0.33, latency_us: 901.4, bytes: 8388608, iterations: 5, world_size: 3}
pairs:
  description: This node's exchange with each other node (by node index), in GB/s each way.
  returned: always
  type: list
  elements: dict
  sample: [{peer: 1, bytes: 4194304, seconds: 0.0046, gbps: 0.91}]
error:
  description: Why the check failed on this node (a rank's own error, or a timeout); null when
    it did not.
  returned: always
  type: str
  sample: null
seconds:
  description: Wall time of the check on this node, the interpreter's start included.
  returned: always
  type: float
  sample: 4.2
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchherd.cluster.plugins.module_utils._exit import skip_last_collection
from ansible_collections.torchherd.cluster.plugins.module_utils._interconnect import run


def main():
    skip_last_collection()
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", default=""),
            master_addr=dict(type="str", required=True),
            master_port=dict(type="int", required=True),
            node_rank=dict(type="int", required=True),
            node_procs=dict(type="list", elements="int", required=True),
            backend=dict(type="str", default="gloo", choices=["gloo", "nccl"]),
            interface=dict(type="str", default=""),
            bytes=dict(type="int", default=8 << 20),
            iterations=dict(type="int", default=5),
            latency_iterations=dict(type="int", default=20),
            pairs=dict(type="bool", default=True),
            pair_bytes=dict(type="int", default=4 << 20),
            pair_iterations=dict(type="int", default=3),
            budget=dict(type="float", default=5),
            timeout=dict(type="float", default=60),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if not 0 <= p["node_rank"] < len(p["node_procs"]) or min(p["node_procs"] or [0]) < 1:
        module.fail_json(msg=f"node_rank {p['node_rank']} must index node_procs "
                             f"{p['node_procs']}, whose counts must be 1 or more")
    module.exit_json(changed=False, **run(p))


if __name__ == "__main__":
    main()
