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
extends_documentation_fragment:
  - torchherd.cluster.attributes
attributes:
  check_mode:
    support: full
    details: The probe changes nothing lasting, so it runs in check mode too.
  diff_mode:
    support: none
  idempotent:
    support: full
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
"""

import errno
import os
import socket
import threading
import time

from ansible.module_utils.basic import AnsibleModule


def _bind(port):
    last = None
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # One dual-stack socket where the node has IPv6, else plain IPv4.
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind((addr, port))
            sock.listen(64)
            return sock, None
        except OSError as exc:
            last = exc
            sock.close()
    return None, last


class _Listener(threading.Thread):
    """Answers up to `expect` connections with the token, for at most `seconds`."""

    def __init__(self, sock, token, expect, seconds):
        super().__init__(daemon=True)
        self.sock, self.token, self.expect = sock, token.encode() + b"\n", expect
        self.deadline = time.monotonic() + seconds
        self.served = 0

    def run(self):
        try:
            while self.served < self.expect and time.monotonic() < self.deadline:
                self.sock.settimeout(max(0.05, self.deadline - time.monotonic()))
                # socket.timeout, not TimeoutError: the two are one only from Python 3.10 on.
                try:
                    conn = self.sock.accept()[0]
                except socket.timeout:
                    break
                with conn:
                    conn.sendall(self.token)
                self.served += 1
        finally:
            self.sock.close()


def _connect_once(p):
    start = time.monotonic()
    with socket.create_connection((p["host"], p["port"]), timeout=p["timeout"]) as sock:
        sock.settimeout(max(0.1, p["timeout"] - (time.monotonic() - start)))
        return sock.recv(256).decode(errors="replace").strip()


def connect(p):
    """(reachable, error): retries a refused connection until the listener's window closes."""
    deadline = time.monotonic() + p["seconds"]
    while True:
        try:
            answer = _connect_once(p)
        except ConnectionRefusedError:
            if time.monotonic() + 0.1 < deadline:
                time.sleep(0.1)
                continue
            return False, (f"connection refused for {p['seconds']:g} s (nothing listens there, "
                           f"or a firewall rejects it)")
        except socket.timeout:
            return False, f"timed out after {p['timeout']:g} s (a firewall dropping the port?)"
        except OSError as exc:
            unreachable = exc.errno == errno.EHOSTUNREACH
            return False, "no route to host" if unreachable else (exc.strerror or str(exc))
        if answer == p["token"]:
            return True, None
        return False, (f"something else answers on {p['host']}:{p['port']} (not the master's "
                       f"probe listener): is {p['host']} the master's address?")


def main():
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
        ),
        supports_check_mode=True,
    )
    p = module.params
    result = {"changed": False}
    listener = None
    if p["listen"]:
        sock, error = _bind(p["port"])
        result["listening"] = sock is not None
        if sock is None:
            reason = os.strerror(error.errno) if error.errno else str(error)
            module.exit_json(reachable=False, served=0, seconds=0.0,
                             error=f"cannot listen on port {p['port']}: {reason}", **result)
        listener = _Listener(sock, p["token"], p["expect"], p["seconds"])
        listener.start()
    start = time.monotonic()
    reachable, error = connect(p)
    seconds = round(time.monotonic() - start, 3)
    if listener is not None:
        # The other nodes are still connecting: answer them until all came or time is up.
        listener.join()
        result["served"] = listener.served
    module.exit_json(reachable=reachable, error=error, seconds=seconds, **result)


if __name__ == "__main__":
    main()
