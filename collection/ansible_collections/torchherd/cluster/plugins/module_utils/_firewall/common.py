# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What every firewall backend shares: the error, the commands, the run's names and tags, what
a run needs (Spec), the plan, and the files torchherd keeps on the node.

Runs on the nodes: Python 3.8 and later.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import shutil
import subprocess

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic

TAG = "torchherd:"
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# nftables comments hold at most 128 bytes: "torchherd:" + id + ":" + 8 hex digits must fit.
MAX_TAG_ID = 64

LEDGER_DIR = "/var/lib/torchherd/firewall"
BOOT_DIR = "/etc/torchherd/firewall"
BOOT_SUFFIXES = (".nft.json", ".iptables", ".ip6tables")


class FirewallError(Exception):
    """A check or a command failed; msg says what to fix, details go with it into the result
    (cmd, detected)."""

    def __init__(self, msg, **details):
        super().__init__(msg)
        self.msg = msg
        self.details = details


class Runner:
    """Runs this node's firewall tools as argument lists for a module; a failed command
    raises FirewallError."""

    def __init__(self, module):
        self.check_mode = module.check_mode
        self.warn = module.warn
        self._module = module

    def which(self, name):
        return self._module.get_bin_path(name)

    def run(self, argv, data=None, what=None):
        rc, out, err = self._command(argv, data)
        if rc != 0:
            detail = (err or out).strip()[-2000:]
            raise FirewallError(f"{what or ' '.join(argv[:3])} failed (exit code {rc}): {detail}",
                                cmd=argv)
        return out

    def probe(self, argv):
        """(rc, out, err) of a command whose failure is an answer, not an error."""
        return self._command(argv)

    def _command(self, argv, data=None):
        return self._module.run_command(argv, data=data, binary_data=data is not None)


class ProcessRunner(Runner):
    """Runner for code outside a module (the job's supervisor, which removes the rules the start
    opened once its job has ended): the same commands, run with subprocess; warnings go to
    `say` (the node log)."""

    # Where a module's get_bin_path looks besides PATH.
    SBIN = ("/sbin", "/usr/sbin", "/usr/local/sbin")

    def __init__(self, say=print):  # pylint: disable=super-init-not-called
        self.check_mode = False
        self.warn = say

    def which(self, name):
        path = os.pathsep.join([os.environ.get("PATH", os.defpath)] + list(self.SBIN))
        return shutil.which(name, path=path)

    def _command(self, argv, data=None):
        try:
            proc = subprocess.run(argv, input=data.encode() if isinstance(data, str) else data,
                                  capture_output=True, check=False, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 127, "", str(exc)
        return (proc.returncode, proc.stdout.decode(errors="replace"),
                proc.stderr.decode(errors="replace"))


def short_hash(text, length=8):
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def tag_id(run_id):
    """The run id as rules name it: whole up to 64 characters, else cut and hashed."""
    if len(run_id) <= MAX_TAG_ID:
        return run_id
    return run_id[:55] + "~" + short_hash(run_id)


def run_tag(run_id):
    return TAG + tag_id(run_id)


def rule_comment(run_id, text):
    """Comment of one nftables/iptables rule: the run and a fingerprint of the rule."""
    return f"{run_tag(run_id)}:{short_hash(text)}"


# ---------------------------------------------------------------------------------------------
# What a run needs


class Spec:
    """The traffic one run allows on one node: TCP from its peers, to any port or to ports."""

    def __init__(self, run_id, v4, v6, mode, ports):
        self.run_id = run_id
        self.v4 = tuple(v4)
        self.v6 = tuple(v6)
        self.mode = mode
        self.ports = tuple(ports) if mode == "ports" else ()

    def families(self):
        """(ip version, addresses) for each version with peers."""
        return [(v, a) for v, a in ((4, self.v4), (6, self.v6)) if a]

    @property
    def empty(self):
        return not (self.v4 or self.v6) or (self.mode == "ports" and not self.ports)


def parse_ports(values):
    """Ports and ranges ("29500", "40000-40100" or "40000:40100") as sorted (low, high) pairs."""
    ports = set()
    for value in values:
        text = str(value).strip()
        match = re.match(r"^(\d+)(?:[-:](\d+))?$", text)
        if not match:
            raise ValueError(f"port {text!r}: expected a port (29500) or a range (40000-40100)")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if not 1 <= low <= high <= 65535:
            raise ValueError(f"port {text!r}: expected 1 <= low <= high <= 65535")
        ports.add((low, high))
    return sorted(ports)


def port_text(port, sep="-"):
    low, high = port
    return str(low) if low == high else f"{low}{sep}{high}"


def split_addresses(addresses):
    """Addresses and networks, normalized, sorted and split by IP version: (v4, v6).

    A host is written as a plain address, a network with its prefix length."""
    found = {4: set(), 6: set()}
    for value in addresses:
        net = ipaddress.ip_network(str(value).strip(), strict=False)
        found[net.version].add(net)
    return tuple(
        [str(n.network_address) if n.prefixlen == n.max_prefixlen else str(n)
         for n in sorted(found[v])]
        for v in (4, 6)
    )


def diff(before, after):
    """Ansible's diff of two lists of rule lines."""
    def text(lines):
        return "".join(line + "\n" for line in sorted(lines))
    return {"before": text(before), "after": text(after)}


class Plan:
    """What one backend has of the run (before), will have (after), and the commands between."""

    def __init__(self, backend, before, after, actions, note=None):
        self.backend = backend
        self.before = list(before)
        self.after = list(after)
        self.actions = list(actions)
        self.note = note

    @property
    def changed(self):
        return bool(self.actions)


# ---------------------------------------------------------------------------------------------
# Files of torchherd's own on the node


def read_text(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def remove(path):
    """Remove a file, then torchherd's directories it leaves empty."""
    os.remove(path)
    for directory in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        if os.path.basename(directory) in ("firewall", "torchherd"):
            try:
                os.rmdir(directory)
            except OSError:
                break


def write_text(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, text, mode)
