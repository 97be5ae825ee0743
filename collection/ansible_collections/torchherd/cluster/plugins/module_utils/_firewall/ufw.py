# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""ufw: "allow proto tcp from PEER to any [port P]" with the runs in the comment. ufw keeps
one rule for identical specs whatever their comments, so runs needing the same rule share
it: its comment "torchherd:<run>,<run>,..." lists them, and the last run to leave deletes it.

Runs on the nodes: Python 3.8 and later.
"""

from __future__ import annotations

import re
import shlex

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.common import (
    TAG,
    FirewallError,
    Plan,
    port_text,
    read_text,
    tag_id,
)

# ufw's multiport rules take at most 15 ports, a range counting as two.
UFW_MAX_PORTS = 15
UFW_CONF = "/etc/ufw/ufw.conf"
UFW_RULES = (("/etc/ufw/user.rules", 4), ("/etc/ufw/user6.rules", 6))


def ufw_keys(spec):
    """The run's ufw rules as (ip version, source, ports): ports 'any' or a ufw port list."""
    if spec is None or spec.empty:
        return []
    groups = ["any"]
    if spec.mode == "ports":
        groups, current, used = [], [], 0
        for port in spec.ports:
            cost = 1 if port[0] == port[1] else 2
            if used + cost > UFW_MAX_PORTS:
                groups.append(",".join(current))
                current, used = [], 0
            current.append(port_text(port, ":"))
            used += cost
        groups.append(",".join(current))
    return sorted((version, address, ports)
                  for version, addresses in spec.families()
                  for address in addresses for ports in groups)


def ufw_parse(text, version):
    """The simple allow rules of ufw's user.rules (or user6.rules): [((version, src, ports), comment)].

    A rule is kept in the file as `### tuple ### allow tcp PORTS DST any SRC in comment=HEX`."""
    found = []
    for line in text.splitlines():
        if not line.startswith("### tuple ### "):
            continue
        fields = line[len("### tuple ### "):].split()
        comment = ""
        if fields and fields[-1].startswith("comment="):
            try:
                comment = bytes.fromhex(fields.pop()[len("comment="):]).decode("utf-8", "replace")
            except ValueError:
                comment = ""
        if len(fields) != 7:
            continue  # application rules, interfaces and the like: never torchherd's
        action, proto, ports, dst, sport, src, direction = fields
        if (action, proto, sport, direction) == ("allow", "tcp", "any", "in") and dst in ("0.0.0.0/0", "::/0"):
            found.append(((version, src, ports), comment))
    return found


def ufw_runs(comment):
    """The runs a torchherd ufw comment names, or None for anybody else's comment."""
    if not comment.startswith(TAG):
        return None
    return [run for run in comment[len(TAG):].split(",") if run]


def ufw_argv(key, comment):
    """ufw's words for a rule (after `ufw allow` or `ufw delete allow`)."""
    _version, source, ports = key
    argv = ["proto", "tcp", "from", source, "to", "any"]
    if ports != "any":
        argv += ["port", ports]
    return argv + ["comment", comment]


def ufw_plan(existing, spec, run_id):
    """Actions: (verb, key, comment) with verb 'allow' (add, or replace the comment of the
    identical rule) or 'delete' (only the rule with exactly that comment)."""
    me = tag_id(run_id)
    wanted = set(ufw_keys(spec))
    comments = dict(existing)

    def line(key, comment):
        return "ufw allow " + shlex.join(ufw_argv(key, comment))

    before, after, actions = [], [], []
    note = None
    for key, comment in existing:
        runs = ufw_runs(comment)
        if runs is None or me not in runs:
            continue
        before.append(line(key, comment))
        if key not in wanted:
            others = [run for run in runs if run != me]
            if others:
                actions.append(("allow", key, TAG + ",".join(others)))
            else:
                actions.append(("delete", key, comment))
    for key in sorted(wanted):
        comment = comments.get(key)
        runs = ufw_runs(comment) if comment is not None else []
        if runs is None:
            # The admin's own identical rule already allows it; it stays theirs.
            note = "ufw: some of the traffic is already allowed by rules not made by torchherd"
            continue
        if me not in runs:
            comment = TAG + ",".join(runs + [me])
            actions.append(("allow", key, comment))
        after.append(line(key, comment))
    return Plan("ufw", before, after, actions, note)


class Ufw:
    """ufw's configuration and rules files, read once (its rules live in the iptables tables
    read by `iptables`); plans from them and applies the plan."""

    def __init__(self, runner, iptables):
        self.runner = runner
        self.ufw = runner.which("ufw")
        self.existing = []
        self.enabled = False
        if self.ufw:
            # What `ufw status` reports as active (it starts a Python program, ten times
            # slower): enabled in ufw.conf, and its chains loaded in the kernel.
            conf = re.search(r"^ENABLED=(\S+)", read_text(UFW_CONF) or "", re.MULTILINE)
            self.enabled = bool(conf) and conf.group(1).strip("\"'") == "yes" and any(
                "ufw-user-input" in listing["chains"] for _restore, listing in iptables.tools.values())
            for path, version in UFW_RULES:
                self.existing += ufw_parse(read_text(path) or "", version)

    @property
    def installed(self):
        return bool(self.ufw)

    usable = installed

    @property
    def active(self):
        return self.enabled

    def plan(self, spec, run_id, persistent):
        return [ufw_plan(self.existing, spec, run_id)]

    def apply(self, plans):
        for verb, key, comment in plans[0].actions:
            argv = [self.ufw] + (["delete", "allow"] if verb == "delete" else ["allow"])
            argv += ufw_argv(key, comment)
            out = self.runner.run(argv, what="ufw " + verb)
            # ufw reports some refusals on stdout with exit code 0.
            if "Could not" in out or "ERROR" in out:
                raise FirewallError(f"ufw {verb}: {out.strip()}", cmd=argv)
