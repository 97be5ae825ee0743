#!/usr/bin/python
# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
module: tcp_probe
author: torchherd developers (!UNKNOWN)
version_added: 0.1.0
short_description: Prove with a real TCP connection that every node reaches the master port
description:
  - Connects to O(host):O(port) and checks that the answer is O(token), so reaching some other
    service on that address does not count.
  - With O(listen=true) (the master) the module also listens on O(port) while it connects, and
    answers every connection with O(token) until O(expect) nodes have connected or O(seconds)
    have passed. Run on every node in one task, the master listening and every node (the master
    too) connecting, the whole probe is a single round trip, and no listener outlives it.
  - A connection refused is tried again until O(seconds) have passed, since the master may
    start listening a moment after a node first tries.
  - A firewall that drops or rejects the port, a wrong route or an address that is not the
    master's all show up here, before the job starts.
  - Then every node offers a port at the address it connected from and the listener connects
    back to it there, as the job's peers will (gloo and NCCL listen on every node); a node that
    cannot be reached back shows in RV(back_error) and RV(back_failed).
extends_documentation_fragment:
  - torchherd.cluster._attributes
  - torchherd.cluster._attributes.INFO_MODULE
options:
  host:
    description: Address to connect to, the master's as the other nodes reach it.
    type: str
    required: true
  port:
    description: TCP port.
    type: int
    default: 29500
  token:
    description: What the listener answers; the connecting side checks it.
    type: str
    default: torchherd-probe
  timeout:
    description: Seconds one connection attempt may wait for the handshake and the answer.
    type: float
    default: 3
  listen:
    description: Listen on O(port) too, for the other nodes (set on the master only).
    type: bool
    default: false
  expect:
    description: Connections after which the listener stops (O(listen=true)), the master's own
      included.
    type: int
    default: 1
  seconds:
    description: Longest life of the listener, and how long a refused connection is retried.
    type: float
    default: 20
  source:
    description:
      - The local address to connect from, the one of the interface the job's traffic uses
        (RV(torchherd.cluster.node_facts#module:interface)); the answer must then come back to
        it, as the job's peers' traffic must. Empty lets the kernel pick.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Probe the master port from every node, the master listening
  torchherd.cluster.tcp_probe:
    host: 10.0.0.1
    port: 29500
    token: run-1
    listen: "{{ inventory_hostname == 'node0' }}"
    expect: "{{ ansible_play_hosts | length }}"
"""

RETURN = r"""
reachable:
  description: Whether the listener answered with the token.
  returned: always
  type: bool
  sample: true
error:
  description: Why the connection failed, or why the port could not be listened on.
  returned: always
  type: str
  sample: "timed out after 3 s (a firewall dropping the port?)"
seconds:
  description: Time to connect and read the answer.
  returned: always
  type: float
  sample: 0.002
listening:
  description: Whether the listener could bind the port (O(listen=true)).
  returned: when O(listen=true)
  type: bool
  sample: true
served:
  description: Connections the listener answered (O(listen=true)).
  returned: when O(listen=true)
  type: int
  sample: 3
address:
  description: The local address this node connected from.
  returned: when RV(reachable) is true
  type: str
  sample: 10.67.101.11
back_error:
  description:
    - Why the master could not open a connection back to RV(address) on this node (as the job's
      peers must); null when it could.
  returned: always
  type: str
  sample: null
back_failed:
  description: Address to reason, for every node the master could not connect back to.
  returned: when O(listen=true) and the port could be listened on
  type: dict
  sample: {}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchherd.cluster.plugins.module_utils._exit import skip_last_collection
from ansible_collections.torchherd.cluster.plugins.module_utils._probe import probe


def main():
    skip_last_collection()
    module = AnsibleModule(
        argument_spec=dict(
            host=dict(type="str", required=True),
            port=dict(type="int", default=29500),
            # Names the run so that no other service passes for the listener; no secret.
            token=dict(type="str", default="torchherd-probe", no_log=False),
            timeout=dict(type="float", default=3),
            listen=dict(type="bool", default=False),
            expect=dict(type="int", default=1),
            seconds=dict(type="float", default=20),
            source=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )
    p = module.params
    result, _held = probe(p["host"], p["port"], p["token"], p["timeout"], p["seconds"],
                          listen=p["listen"], expect=p["expect"], source=p["source"] or None)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
