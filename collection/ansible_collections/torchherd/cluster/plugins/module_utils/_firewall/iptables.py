# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""iptables (and ip6tables): a chain "th-<run>" of the run's own, jumped to from the head of
INPUT by a rule with the comment "torchherd:<run>"; the chain's rules carry
"torchherd:<run>:<fingerprint>", so comparing comments tells whether they are the wanted ones.

Runs on the nodes: Python 3.8 and later.
"""

from __future__ import annotations

import os
import shlex

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.common import (
    BOOT_DIR,
    BOOT_SUFFIXES,
    TAG,
    Plan,
    port_text,
    rule_comment,
    run_tag,
    short_hash,
)

# iptables chain names hold at most 28 characters.
MAX_CHAIN = 28


def iptables_chain(run_id):
    """The run's own iptables chain: th-<run id>, cut and hashed past 28 characters."""
    name = "th-" + run_id
    if len(name) <= MAX_CHAIN:
        return name
    return f"th-{run_id[:16]}-{short_hash(run_id)}"


def iptables_listing(text):
    """`iptables -S` of the filter table: {'policy': str, 'chains': set, 'rules': [argv]}."""
    policy = "ACCEPT"
    chains = set()
    rules = []
    for line in text.splitlines():
        argv = shlex.split(line)
        if len(argv) >= 3 and argv[0] == "-P" and argv[1] == "INPUT":
            policy = argv[2]
        elif len(argv) >= 2 and argv[0] == "-N":
            chains.add(argv[1])
        elif len(argv) >= 2 and argv[0] == "-A":
            rules.append(argv)
    return {"policy": policy, "chains": chains, "rules": rules}


def _option(argv, name):
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def iptables_blocking(listing):
    """Whether INPUT can stop a packet: a policy other than ACCEPT, or a DROP, REJECT or QUEUE
    rule in INPUT or a chain it leads to (a disabled ufw leaves empty chains behind, which
    stop nothing). torchherd's own chains are left out."""
    if listing["policy"] != "ACCEPT":
        return True
    chains, seen = ["INPUT"], set()
    while chains:
        chain = chains.pop()
        seen.add(chain)
        for argv in listing["rules"]:
            if argv[1] != chain or (_option(argv, "--comment") or "").startswith(TAG):
                continue
            target = _option(argv, "-j") or _option(argv, "-g")
            if target in ("DROP", "REJECT", "QUEUE", "NFQUEUE"):
                return True
            if target in listing["chains"] and target not in seen:
                chains.append(target)
    return False


def iptables_rules(spec, version):
    """The run's rules in its chain, written the way `iptables -S` prints them."""
    if spec is None or spec.empty:
        return []
    chain = iptables_chain(spec.run_id)
    addresses = spec.v4 if version == 4 else spec.v6
    host = "/32" if version == 4 else "/128"
    rules = []
    for address in addresses:
        source = address if "/" in address else address + host
        matches = [["-s", source, "-p", "tcp"]]
        if spec.mode == "ports":
            matches = [["-s", source, "-p", "tcp", "-m", "tcp", "--dport", port_text(p, ":")]
                       for p in spec.ports]
        for match in matches:
            text = " ".join(match + ["-j", "ACCEPT"])
            rules.append(["-A", chain] + match + ["-m", "comment", "--comment",
                                                  rule_comment(spec.run_id, text), "-j", "ACCEPT"])
    return rules


def _jump(run_id):
    return ["-m", "comment", "--comment", run_tag(run_id), "-j", iptables_chain(run_id)]


def iptables_plan(listing, spec, run_id, version):
    """Actions: one iptables-restore --noflush input (the table changes atomically)."""
    chain = iptables_chain(run_id)
    command = "iptables" if version == 4 else "ip6tables"
    mine = [a for a in listing["rules"] if a[1] == chain]
    jumps = [a for a in listing["rules"]
             if a[1] == "INPUT" and _option(a, "-j") == chain and _option(a, "--comment") == run_tag(run_id)]
    wanted = iptables_rules(spec, version)
    before = [f"{command} {shlex.join(a)}" for a in jumps + mine]
    exists = chain in listing["chains"]
    lines = []
    if wanted:
        after = [f"{command} " + shlex.join(["-A", "INPUT"] + _jump(run_id))]
        after += [f"{command} {shlex.join(a)}" for a in wanted]
        same = exists and len(jumps) == 1 and sorted(
            _option(a, "--comment") for a in mine) == sorted(_option(a, "--comment") for a in wanted)
        if same:
            after = before
        else:
            lines = [f":{chain} - [0:0]"] + [shlex.join(a) for a in wanted]
            if not jumps:
                lines.append(shlex.join(["-I", "INPUT", "1"] + _jump(run_id)))
            lines += [shlex.join(["-D", "INPUT"] + _jump(run_id))] * max(len(jumps) - 1, 0)
    else:
        after = []
        lines = [shlex.join(["-D", "INPUT"] + _jump(run_id))] * len(jumps)
        if exists:
            lines += [f"-F {chain}", f"-X {chain}"]
    actions = ["*filter\n" + "".join(line + "\n" for line in lines) + "COMMIT\n"] if lines else []
    return Plan(command, before, after, actions)


def iptables_boot(spec, run_id, version):
    """iptables-restore --noflush input that puts the run's chain back at boot."""
    wanted = iptables_rules(spec, version)
    if not wanted:
        return None
    lines = [f":{iptables_chain(run_id)} - [0:0]"] + [shlex.join(a) for a in wanted]
    lines.append(shlex.join(["-I", "INPUT", "1"] + _jump(run_id)))
    return "*filter\n" + "".join(line + "\n" for line in lines) + "COMMIT\n"


class Iptables:
    """The node's iptables and ip6tables filter tables, read once; plans from them and
    applies the plans."""

    def __init__(self, runner):
        self.runner = runner
        self.tools = {}
        for version, command in ((4, "iptables"), (6, "ip6tables")):
            binary, restore = runner.which(command), runner.which(command + "-restore")
            if not (binary and restore):
                continue
            rc, out, _err = runner.probe([binary, "-t", "filter", "-S"])
            if rc == 0:  # no kernel support (or a legacy/nft mix-up) leaves the family out
                self.tools[version] = (restore, iptables_listing(out))

    @property
    def installed(self):
        return bool(self.tools)

    usable = installed

    @property
    def active(self):
        return any(iptables_blocking(listing) for _restore, listing in self.tools.values())

    def plan(self, spec, run_id, persistent):
        return [iptables_plan(listing, spec, run_id, version)
                for version, (_restore, listing) in sorted(self.tools.items())]

    def apply(self, plans):
        restores = [restore for _version, (restore, _listing) in sorted(self.tools.items())]
        for restore, plan in zip(restores, plans):
            for batch in plan.actions:
                self.runner.run([restore, "--noflush"], data=batch, what=os.path.basename(restore))

    def boot(self, spec, run_id):
        """{file: content} and the commands that load them at boot."""
        files, commands = {}, []
        for version, (restore, _listing) in sorted(self.tools.items()):
            text = iptables_boot(spec, run_id, version)
            if text:
                path = os.path.join(BOOT_DIR, run_id + BOOT_SUFFIXES[version // 3])
                files[path] = text
                commands.append([restore, "--noflush", path])
        return files, commands
