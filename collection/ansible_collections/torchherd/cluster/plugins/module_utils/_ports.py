# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The master port bound as a server binds it: checked free before a launch, or picked free
where the job's master_port is auto (node_facts), and listened on by the probe's listener
(_probe)."""

from __future__ import annotations

import os
import socket


def _bind(sock, family, addr, port, v6only):
    # SO_REUSEADDR, so that TIME_WAIT leftovers don't count as in use.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
    sock.bind((addr, port))


def bind(port):
    """(listening socket, None) or (None, reason)."""
    last = None
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        # A kernel without IPv6 (ipv6.disable=1, common on HPC nodes) refuses the AF_INET6
        # socket itself: then plain IPv4.
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            last = exc
            continue
        try:
            # One dual-stack socket where the node has IPv6, else plain IPv4.
            _bind(sock, family, addr, port, v6only=False)
            sock.listen(64)
            return sock, None
        except OSError as exc:
            last = exc
            sock.close()
    reason = os.strerror(last.errno) if last.errno else str(last)
    return None, f"cannot listen on port {port}: {reason}"


def port_free(port):
    """Whether a server could bind `port` on every address of the node, IPv4 and IPv6."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:
            _bind(sock, family, addr, port, v6only=True)
        except OSError:
            return False
        finally:
            sock.close()
    return True


def pick_free(tries=5, prefer=0):
    """A port free on every address of the node, as the kernel hands one out for port 0 (as
    torch's own get_free_port does): the master port of a job whose master_port is auto, so
    that users and checkouts of one machine each get their own. None where none was found.
    With `prefer`, that port where it is free (a relaunch keeps its master port)."""
    if prefer and port_free(prefer):
        return prefer
    for _try in range(tries):
        sock, _why = bind(0)
        if sock is None:
            return None
        with sock:
            port = sock.getsockname()[1]
        # Free for the dual-stack socket; the job's launcher may bind IPv4 and IPv6 apart.
        if port_free(port):
            return port
    return None
