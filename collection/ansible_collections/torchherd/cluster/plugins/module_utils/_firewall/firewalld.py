# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""firewalld: rich rules in the zone that receives each peer's traffic. Rich rules take no
comment: a ledger file per run lists the rules it needs and whether it (or another run) added
them, or found them already there (then never removes them).

Runs on the nodes: Python 3.8 and later.
"""

from __future__ import annotations

import glob
import ipaddress
import json
import os
import re

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.common import (
    LEDGER_DIR,
    Plan,
    port_text,
    read_text,
    remove,
    write_text,
)


def rich_rules(spec):
    """The run's rich rules: [(address, rule)]."""
    if spec is None or spec.empty:
        return []
    rules = []
    for version, addresses in spec.families():
        family = "ipv4" if version == 4 else "ipv6"
        for address in addresses:
            head = f'rule family="{family}" source address="{address}"'
            if spec.mode == "members":
                rules.append((address, head + ' protocol value="tcp" accept'))
            else:
                rules += [(address, head + f' port port="{port_text(p)}" protocol="tcp" accept')
                          for p in spec.ports]
    return rules


def firewalld_zones(text):
    """`firewall-cmd --list-all-zones`: {zone: {'interfaces': [...], 'sources': [...], 'rich': [...]}}."""
    zones = {}
    current = None
    key = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            current = zones.setdefault(line.split()[0], {"interfaces": [], "sources": [], "rich": []})
            key = None
        elif current is None:
            continue
        elif line.startswith("\t"):
            if key == "rich rules":
                current["rich"].append(line.strip())
        else:
            key, _sep, value = line.strip().partition(":")
            if key in ("interfaces", "sources"):
                current[key] = value.split()
    return zones


def firewalld_zone(address, zones, default_zone, interface):
    """The zone firewalld gives a peer's packets: a zone with a source that holds the address,
    else the zone of the interface they arrive on, else the default zone."""
    peer = ipaddress.ip_network(address, strict=False)
    for name in sorted(zones):
        for source in zones[name]["sources"]:
            try:
                net = ipaddress.ip_network(source, strict=False)
            except ValueError:
                continue  # ipset: or MAC sources
            if net.version == peer.version and peer.subnet_of(net):
                return name
    for name in sorted(zones):
        if interface and interface in zones[name]["interfaces"]:
            return name
    return default_zone


def firewalld_plan(wanted, runtime, permanent, ledgers, run_id, persistent):
    """wanted: [(zone, rule)]; runtime/permanent: {zone: [rules]} (permanent None when not
    read); ledgers: {run id: ledger}. Actions: (layer, verb, zone, rule), layer 'runtime' or
    'permanent', verb 'add' or 'remove'; then ('ledger', run id, new ledger or None) when the
    ledger changes."""
    mine = ledgers.get(run_id) or {"rules": [], "permanent": False}
    owned_by_me = {(e["zone"], e["rule"]): e["owned"] for e in mine["rules"]}
    others = [led for run, led in ledgers.items() if run != run_id]
    owned_elsewhere = {(e["zone"], e["rule"]) for led in others for e in led["rules"] if e["owned"]}
    permanent_elsewhere = {(e["zone"], e["rule"]) for led in others if led.get("permanent")
                           for e in led["rules"] if e["owned"]}
    permanent = permanent or {}
    actions = []
    rules = []
    for zone, rule in wanted:
        present = rule in runtime.get(zone, [])
        key = (zone, rule)
        owned = owned_by_me.get(key, not present or key in owned_elsewhere)
        if owned and not present:
            actions.append(("runtime", "add", zone, rule))
        if owned and persistent and rule not in permanent.get(zone, []):
            actions.append(("permanent", "add", zone, rule))
        rules.append({"zone": zone, "rule": rule, "owned": owned})
    for key, owned in sorted(owned_by_me.items()):
        zone, rule = key
        if not owned:
            continue
        if key not in set(wanted) and key not in owned_elsewhere and rule in runtime.get(zone, []):
            actions.append(("runtime", "remove", zone, rule))
        if (mine.get("permanent") and (key not in set(wanted) or not persistent)
                and key not in permanent_elsewhere and rule in permanent.get(zone, [])):
            actions.append(("permanent", "remove", zone, rule))
    ledger = {"run_id": run_id, "permanent": bool(persistent), "rules": rules} if rules else None
    if ledger != (ledgers.get(run_id) or None):
        actions.append(("ledger", run_id, ledger))

    def lines(entries, permanent_too):
        suffix = " (runtime and permanent)" if permanent_too else ""
        return [f"firewalld zone {e['zone']}: {e['rule']}{suffix}"
                + ("" if e["owned"] else " (already there, not torchherd's)")
                for e in entries]

    return Plan("firewalld", lines(mine["rules"], mine.get("permanent")),
                lines(rules, persistent), actions)


class Firewalld:
    """The runs' ledgers and, when firewalld runs, its zones, read once; plans from them and
    applies the plan."""

    def __init__(self, runner, persistent):
        self.runner = runner
        self.cmd = runner.which("firewall-cmd")
        self.running = False
        self.ledgers = {}
        for path in glob.glob(os.path.join(LEDGER_DIR, "*.firewalld.json")):
            try:
                ledger = json.loads(read_text(path) or "")
                self.ledgers[ledger["run_id"]] = ledger
            except (ValueError, KeyError, TypeError):
                continue
        if self.cmd:
            self.running = runner.probe([self.cmd, "--state"])[0] == 0
        self.runtime = self.permanent = None
        if self.running:
            self.default_zone = runner.run([self.cmd, "--get-default-zone"]).strip()
            self.zones = firewalld_zones(runner.run([self.cmd, "--list-all-zones"]))
            self.runtime = {name: zone["rich"] for name, zone in self.zones.items()}
            if persistent or any(led.get("permanent") for led in self.ledgers.values()):
                listing = runner.run([self.cmd, "--permanent", "--list-all-zones"])
                self.permanent = {n: z["rich"] for n, z in firewalld_zones(listing).items()}

    @property
    def installed(self):
        return bool(self.cmd)

    @property
    def usable(self):
        # firewall-cmd talks to the daemon: a stopped firewalld can be neither read nor changed.
        return self.running

    active = usable

    def _interface(self, address):
        ip = self.runner.which("ip")
        if not ip:
            return None
        rc, out, _err = self.runner.probe([ip, "route", "get", address.split("/")[0]])
        match = re.search(r"\bdev (\S+)", out) if rc == 0 else None
        return match.group(1) if match else None

    def plan(self, spec, run_id, persistent):
        wanted = sorted({(firewalld_zone(address, self.zones, self.default_zone, self._interface(address)), rule)
                         for address, rule in rich_rules(spec)})
        return [firewalld_plan(wanted, self.runtime, self.permanent, self.ledgers, run_id, persistent)]

    def apply(self, plans):
        grouped = {}
        for action in plans[0].actions:
            if action[0] != "ledger":
                layer, verb, zone, rule = action
                grouped.setdefault((layer, verb, zone), []).append(rule)
        # One call per zone and change: firewall-cmd takes many rich rules at once.
        for (layer, verb, zone), rules in sorted(grouped.items()):
            argv = [self.cmd] + (["--permanent"] if layer == "permanent" else []) + ["--zone=" + zone]
            argv += [f"--{verb}-rich-rule={rule}" for rule in rules]
            self.runner.run(argv, what=f"firewall-cmd --{verb}-rich-rule")
        for action in plans[0].actions:
            if action[0] == "ledger":
                _kind, run_id, ledger = action
                path = os.path.join(LEDGER_DIR, run_id + ".firewalld.json")
                if ledger:
                    write_text(path, json.dumps(ledger, indent=1, sort_keys=True) + "\n", 0o600)
                elif os.path.exists(path):
                    remove(path)
