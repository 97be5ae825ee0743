# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The network path of a job on one node: which interface its traffic to the master leaves on,
and that interface's own address.

gloo and NCCL pick an interface by themselves (the one the host name resolves to, or the first
that is up): on a node with a management and a data network that is often the wrong one, and a
name that does not exist on a node makes NCCL fail without saying so. So the node facts choose
it here, the way the kernel routes to the master's address (or the user names it), and the start
exports it per node (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) after the barrier proved it: every
node connects to the master from that interface's own address, so the master's answer must come
back to the address the job's peers will use."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess

_IP_TIMEOUT = 10


def _ip_json(argv):
    """`ip -j ...` parsed, or (None, error)."""
    try:
        proc = subprocess.run(["ip", "-j", *argv], capture_output=True, text=True,
                              timeout=_IP_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"ip {' '.join(argv)}: {exc}"
    if proc.returncode != 0:
        return None, (proc.stderr.strip() or f"ip {' '.join(argv)}: exit code {proc.returncode}")
    try:
        return json.loads(proc.stdout or "[]"), None
    except ValueError:
        return None, f"ip {' '.join(argv)}: unreadable output"


def interfaces():
    """Interface name -> its addresses (IPv4 and IPv6, loopback included), {} when unknown."""
    links, _error = _ip_json(["addr", "show"])
    if links is None:
        return _interfaces_without_iproute2()
    return {link["ifname"]: [a["local"] for a in link.get("addr_info", []) if "local" in a]
            for link in links if "ifname" in link}


def _interfaces_without_iproute2():
    """IPv4 addresses by interface from the kernel (ioctl SIOCGIFADDR), for nodes without
    iproute2."""
    try:
        import fcntl
        import struct
    except ImportError:
        return {}
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915,  # SIOCGIFADDR
                                     struct.pack("256s", name.encode()[:15]))
                found[name] = [socket.inet_ntoa(packed[20:24])]
            except OSError:
                found[name] = []
    return found


def routes():
    """The node's routes, one line each (both families), for messages."""
    lines = []
    for family in ("-4", "-6"):
        try:
            proc = subprocess.run(["ip", family, "route", "show"], capture_output=True,
                                  text=True, timeout=_IP_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired):
            break
        lines += [line.strip() for line in proc.stdout.splitlines() if line.strip()]
    return lines


def resolve(host):
    """The address a host name resolves to on this node (as the job will connect), or
    (None, error)."""
    try:
        return str(ipaddress.ip_address(host)), None
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as exc:
        return None, f"{host} does not resolve on this node ({exc})"
    return infos[0][4][0], None


def _holder(address, ifaces):
    """The interface that holds address, or None."""
    for name, addrs in ifaces.items():
        if address in addrs:
            return name
    return None


def _family_address(addrs, family):
    """The first address of the family (4 or 6) among addrs, link-local IPv6 last."""
    candidates = []
    for text in addrs:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            continue
        if ip.version == family:
            candidates.append((ip.version == 6 and ip.is_link_local, text))
    return min(candidates)[1] if candidates else None


def route_to(address):
    """(interface, source address) the kernel picks for address, or (None, error)."""
    found, error = _ip_json(["route", "get", address])
    if found:
        entry = found[0]
        if entry.get("type") in ("blackhole", "unreachable", "prohibit"):
            return None, f"the route to {address} is {entry['type']}"
        return (entry.get("dev"), entry.get("prefsrc")), None
    if error and "No such file" not in error and "ip route get" not in error:
        return None, error  # iproute2 answered: no route
    # No iproute2: the source address a connected UDP socket gets is the kernel's choice.
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((address, 9))
            source = sock.getsockname()[0]
    except OSError as exc:
        return None, f"no route to {address} ({exc.strerror or exc})"
    return (_holder(source, interfaces()), source), None


def link_speed(name):
    """The link speed the kernel reports for an interface in Mb/s, or None where it reports
    none (virtual interfaces without one, a link that is down: -1)."""
    try:
        with open(f"/sys/class/net/{name}/speed", encoding="ascii") as handle:
            speed = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return speed if speed > 0 else None


def select(master, explicit="", ifaces=None):
    """The job's interface on this node: a dict with name, address (its own, of the master
    address's family), how (explicit, local or route), master (the address the master name
    resolved to), speed (Mb/s, see link_speed) and error (why none could be chosen, with the
    node's interfaces and routes)."""
    found = _select(master, explicit, interfaces() if ifaces is None else ifaces)
    found["speed"] = link_speed(found["name"]) if found["name"] and not found["error"] else None
    return found


def _select(master, explicit, ifaces):
    out = {"name": None, "address": None, "how": None, "master": None, "error": None}
    target, error = resolve(master)
    if target is None:
        return dict(out, error=error)
    out["master"] = target
    family = ipaddress.ip_address(target).version
    listing = ", ".join(f"{n} {' '.join(a) or '(no address)'}" for n, a in ifaces.items())
    if explicit:
        if explicit not in ifaces:
            return dict(out, how="explicit",
                        error=f"no interface {explicit} on this node (it has: {listing})")
        address = _family_address(ifaces[explicit], family)
        if address is None:
            return dict(out, name=explicit, how="explicit",
                        error=f"interface {explicit} has no IPv{family} address to reach "
                              f"{target} from (it has: {listing})")
        return dict(out, name=explicit, address=address, how="explicit")
    holder = _holder(target, ifaces)
    if holder is not None:
        # The master itself: its traffic to its own address stays on lo, but its peers reach
        # it on the interface that holds the address.
        return dict(out, name=holder, address=target, how="local")
    found, error = route_to(target)
    if found is None or not found[0]:
        return dict(out, how="route",
                    error=f"no route to {target} ({error or 'no interface'}); routes: "
                          f"{'; '.join(routes()) or 'none'}")
    name, source = found
    address = source if source and _holder(source, ifaces) == name else \
        _family_address(ifaces.get(name, []), family)
    if address is None:
        return dict(out, name=name, how="route",
                    error=f"the route to {target} leaves on {name}, which has no IPv{family} "
                          f"address (it has: {listing})")
    return dict(out, name=name, address=address, how="route")
