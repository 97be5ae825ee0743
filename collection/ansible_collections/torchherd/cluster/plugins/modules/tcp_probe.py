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
  - O(state=listen) starts a short-lived listener on O(port) in the background; it answers
    every connection with O(token) and exits after O(expect) connections or O(seconds).
  - O(state=connect) connects to O(host):O(port) and checks that the answer is O(token), so
    reaching some other service on that address does not count.
  - O(state=stop) ends the listener of O(pid) if it still runs.
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
  state:
    description: Listen, connect or stop.
    type: str
    choices: [listen, connect, stop]
    default: connect
  host:
    description: Address to connect to (O(state=connect)).
    type: str
  port:
    description: TCP port.
    type: int
    default: 29500
  token:
    description: What the listener answers; the connecting side checks it.
    type: str
    default: torchherd-probe
  timeout:
    description: Seconds to wait for the connection and the answer.
    type: float
    default: 3
  expect:
    description: Connections after which the listener exits.
    type: int
    default: 1
  seconds:
    description: Longest life of the listener.
    type: float
    default: 30
  pid:
    description: Pid of the listener to stop (O(state=stop)).
    type: int
"""

EXAMPLES = r"""
- name: Listen on the master port
  torchherd.cluster.tcp_probe:
    state: listen
    port: 29500
    token: run-1
    expect: 3
  register: listener

- name: Connect from every node
  torchherd.cluster.tcp_probe:
    host: 10.0.0.1
    port: 29500
    token: run-1
"""

RETURN = r"""
reachable:
  description: Whether the listener answered with the token (O(state=connect)).
  returned: when O(state=connect)
  type: bool
  sample: true
error:
  description: Why the connection failed.
  returned: when O(state=connect)
  type: str
  sample: "timed out after 3 s (a firewall dropping the port?)"
seconds:
  description: Time to connect and read the answer.
  returned: when O(state=connect)
  type: float
  sample: 0.002
pid:
  description: Pid of the listener (O(state=listen)), null when the port could not be bound.
  returned: when O(state=listen)
  type: int
  sample: 4242
listening:
  description: Whether the listener is up.
  returned: when O(state=listen)
  type: bool
  sample: true
"""

import errno
import os
import signal
import socket
import time

from ansible.module_utils.basic import AnsibleModule


def _bind(port):
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


def _serve(sock, token, expect, seconds):
    os.setsid()
    deadline = time.monotonic() + seconds
    served = 0
    try:
        while served < expect and time.monotonic() < deadline:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            # socket.timeout, not TimeoutError: the two are one only from Python 3.10 on.
            try:
                conn = sock.accept()[0]
            except socket.timeout:
                break
            with conn:
                conn.sendall(token.encode() + b"\n")
            served += 1
    finally:
        os._exit(0)


def listen(module, p):
    sock, error = _bind(p["port"])
    if sock is None:
        module.exit_json(changed=False, listening=False, pid=None,
                         error=os.strerror(error.errno) if error.errno else str(error))
    devnull = os.open(os.devnull, os.O_RDWR)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        # Double fork: the listener outlives this module and the SSH session that ran it.
        child = os.fork()
        if child == 0:
            os.close(read_end)
            os.close(write_end)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            _serve(sock, p["token"], p["expect"], p["seconds"])
        os.write(write_end, str(child).encode())
        os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    listener = int(os.read(read_end, 32) or b"0") or None
    os.close(read_end)
    sock.close()
    module.exit_json(changed=False, listening=True, pid=listener)


def connect(module, p):
    start = time.monotonic()
    error = None
    reachable = False
    try:
        with socket.create_connection((p["host"], p["port"]), timeout=p["timeout"]) as sock:
            sock.settimeout(max(0.1, p["timeout"] - (time.monotonic() - start)))
            answer = sock.recv(256).decode(errors="replace").strip()
        if answer == p["token"]:
            reachable = True
        else:
            error = (f"something else answers on {p['host']}:{p['port']} (not the master's "
                     f"probe listener): is {p['host']} the master's address?")
    except socket.timeout:
        error = f"timed out after {p['timeout']:g} s (a firewall dropping the port?)"
    except ConnectionRefusedError:
        error = "connection refused (nothing listens there, or a firewall rejects it)"
    except OSError as exc:
        unreachable = exc.errno == errno.EHOSTUNREACH
        error = "no route to host" if unreachable else (exc.strerror or str(exc))
    module.exit_json(changed=False, reachable=reachable, error=error,
                     seconds=round(time.monotonic() - start, 3))


def stop(module, p):
    if p["pid"]:
        try:
            os.kill(p["pid"], signal.SIGKILL)
        except OSError:
            pass
    module.exit_json(changed=False)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="connect", choices=["listen", "connect", "stop"]),
            host=dict(type="str"),
            port=dict(type="int", default=29500),
            # Names the run so that no other service passes for the listener; no secret.
            token=dict(type="str", default="torchherd-probe", no_log=False),
            timeout=dict(type="float", default=3),
            expect=dict(type="int", default=1),
            seconds=dict(type="float", default=30),
            pid=dict(type="int"),
        ),
        required_if=[("state", "connect", ["host"])],
        supports_check_mode=True,
    )
    p = module.params
    {"listen": listen, "connect": connect, "stop": stop}[p["state"]](module, p)


if __name__ == "__main__":
    main()
