# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The node side of firewall_rules: reads the node's firewalls, plans with _firewall and
applies the plan, as root. Shared by the firewall_rules module and by torchrun_job, which
opens the job's rules in its start's own round trip where it runs as root anyway.

Runs on the nodes: Python 3.8 and later.
"""

from __future__ import annotations

import fcntl
import glob
import ipaddress
import json
import os
import re
import socket

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import (
    RUN_ID,
    Plan,
    Spec,
    choose_backends,
    diff,
    firewalld_plan,
    firewalld_zone,
    firewalld_zones,
    iptables_blocking,
    iptables_boot,
    iptables_listing,
    iptables_plan,
    nft_boot,
    nft_input_chains,
    nft_items,
    nft_plan,
    parse_ports,
    rich_rules,
    split_addresses,
    ufw_argv,
    ufw_parse,
    ufw_plan,
    unit_name,
)

# The options that say which rules a run needs: firewall_rules's, and the suboptions of
# torchrun_job's firewall option.
RULE_OPTIONS = dict(
    peers=dict(type="list", elements="str", default=[]),
    mode=dict(type="str", default="members", choices=["members", "ports"]),
    ports=dict(type="list", elements="str", default=[]),
    backend=dict(type="str", default="auto",
                 choices=["auto", "nftables", "ufw", "firewalld", "iptables", "none"]),
    persistent=dict(type="bool", default=False),
)

LOCK_FILE = "/run/torchherd-firewall.lock"
LEDGER_DIR = "/var/lib/torchherd/firewall"
BOOT_DIR = "/etc/torchherd/firewall"
BOOT_SUFFIXES = (".nft.json", ".iptables", ".ip6tables")
UNIT_DIR = "/etc/systemd/system"
UFW_CONF = "/etc/ufw/ufw.conf"
UFW_RULES = (("/etc/ufw/user.rules", 4), ("/etc/ufw/user6.rules", 6))


class Node:
    """Runs the firewall tools of this node, as argument lists."""

    def __init__(self, module):
        self.module = module

    def which(self, name):
        return self.module.get_bin_path(name)

    def run(self, argv, data=None, what=None):
        rc, out, err = self.module.run_command(argv, data=data, binary_data=data is not None)
        if rc != 0:
            detail = (err or out).strip()[-2000:]
            self.module.fail_json(msg=f"{what or ' '.join(argv[:3])} failed (exit code {rc}): {detail}",
                                  cmd=argv)
        return out

    def probe(self, argv):
        rc, out, err = self.module.run_command(argv)
        return rc, out, err


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
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Backends: each reads the node once, plans from what it read, applies its plan


class Nftables:
    def __init__(self, node):
        self.node = node
        self.nft = node.which("nft")
        self.items = []
        if self.nft:
            out = node.run([self.nft, "-j", "list", "ruleset"], what="nft -j list ruleset")
            self.items = nft_items(json.loads(out or '{"nftables": []}'))

    @property
    def installed(self):
        return bool(self.nft)

    usable = installed

    @property
    def active(self):
        return bool(nft_input_chains(self.items))

    def plan(self, spec, run_id, persistent):
        return [nft_plan(self.items, spec, run_id)]

    def apply(self, plans):
        for plan in plans:
            if plan.actions:
                self.node.run([self.nft, "-j", "-f", "-"], data=json.dumps({"nftables": plan.actions}),
                              what="nft -j -f -")

    def boot(self, spec, run_id):
        """{file: content} and the commands that load them at boot."""
        batch = nft_boot(self.items, spec)
        if not batch:
            return {}, []
        path = os.path.join(BOOT_DIR, run_id + ".nft.json")
        return {path: json.dumps({"nftables": batch}, indent=1) + "\n"}, [[self.nft, "-j", "-f", path]]


class Iptables:
    def __init__(self, node):
        self.node = node
        self.tools = {}
        for version, command in ((4, "iptables"), (6, "ip6tables")):
            binary, restore = node.which(command), node.which(command + "-restore")
            if not (binary and restore):
                continue
            rc, out, _err = node.probe([binary, "-t", "filter", "-S"])
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
                self.node.run([restore, "--noflush"], data=batch, what=os.path.basename(restore))

    def boot(self, spec, run_id):
        files, commands = {}, []
        for version, (restore, _listing) in sorted(self.tools.items()):
            text = iptables_boot(spec, run_id, version)
            if text:
                path = os.path.join(BOOT_DIR, run_id + BOOT_SUFFIXES[version // 3])
                files[path] = text
                commands.append([restore, "--noflush", path])
        return files, commands


class Ufw:
    def __init__(self, node, iptables):
        self.node = node
        self.ufw = node.which("ufw")
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
            out = self.node.run(argv + ufw_argv(key, comment), what="ufw " + verb)
            if "Could not" in out or "ERROR" in out:
                self.node.module.fail_json(msg=f"ufw {verb}: {out.strip()}", cmd=argv)


class Firewalld:
    def __init__(self, node, persistent):
        self.node = node
        self.cmd = node.which("firewall-cmd")
        self.running = False
        self.ledgers = {}
        for path in glob.glob(os.path.join(LEDGER_DIR, "*.firewalld.json")):
            try:
                ledger = json.loads(read_text(path) or "")
                self.ledgers[ledger["run_id"]] = ledger
            except (ValueError, KeyError, TypeError):
                continue
        if self.cmd:
            self.running = node.probe([self.cmd, "--state"])[0] == 0
        self.runtime = self.permanent = None
        if self.running:
            self.default_zone = node.run([self.cmd, "--get-default-zone"]).strip()
            self.zones = firewalld_zones(node.run([self.cmd, "--list-all-zones"]))
            self.runtime = {name: zone["rich"] for name, zone in self.zones.items()}
            if persistent or any(led.get("permanent") for led in self.ledgers.values()):
                listing = node.run([self.cmd, "--permanent", "--list-all-zones"])
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
        ip = self.node.which("ip")
        if not ip:
            return None
        rc, out, _err = self.node.probe([ip, "route", "get", address.split("/")[0]])
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
            self.node.run(argv, what=f"firewall-cmd --{verb}-rich-rule")
        for action in plans[0].actions:
            if action[0] == "ledger":
                _kind, run_id, ledger = action
                path = os.path.join(LEDGER_DIR, run_id + ".firewalld.json")
                if ledger:
                    write_text(path, json.dumps(ledger, indent=1, sort_keys=True) + "\n", 0o600)
                elif os.path.exists(path):
                    remove(path)


# ---------------------------------------------------------------------------------------------
# Persistence: the nftables and iptables rules of a run, loaded at boot by a unit of its own


def unit_text(run_id, commands):
    lines = [
        "# Written by torchherd's firewall_rules module; removed with the run's rules.",
        "[Unit]",
        f"Description=torchherd firewall rules of run {run_id}",
        "After=nftables.service netfilter-persistent.service",
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
    ]
    lines += ["ExecStart=" + " ".join(argv) for argv in commands]
    lines += ["", "[Install]", "WantedBy=multi-user.target", ""]
    return "\n".join(lines)


def boot_plan(run_id, files, commands):
    """Files (unit included) the run should have for boot, against those it has."""
    unit = os.path.join(UNIT_DIR, unit_name(run_id))
    wanted = dict(files)
    if commands:
        wanted[unit] = unit_text(run_id, commands)
    candidates = [os.path.join(BOOT_DIR, run_id + suffix) for suffix in BOOT_SUFFIXES] + [unit]
    existing = {path: read_text(path) for path in candidates if os.path.exists(path)}
    actions = [("write", path, text) for path, text in sorted(wanted.items())
               if existing.get(path) != text]
    actions += [("remove", path, None) for path in sorted(existing) if path not in wanted]
    lines = {
        "before": [f"boot: {path}" for path in existing],
        "after": [f"boot: {path}" for path in wanted],
    }
    return Plan("boot", lines["before"], lines["after"], actions), unit


def apply_boot(node, plan, unit):
    systemctl = node.which("systemctl")
    if not systemctl:
        node.module.fail_json(msg="persistent rules need systemd (no systemctl on this node)")
    for verb, path, text in plan.actions:
        if verb == "write":
            write_text(path, text, 0o600 if path.startswith(BOOT_DIR) else 0o644)
        else:
            if path == unit:
                node.run([systemctl, "disable", os.path.basename(unit)])
            remove(path)
    node.run([systemctl, "daemon-reload"])
    if os.path.exists(unit):
        node.run([systemctl, "enable", os.path.basename(unit)])


# ---------------------------------------------------------------------------------------------


def resolve(module, peers):
    addresses = []
    for peer in peers:
        peer = peer.strip()
        try:
            ipaddress.ip_network(peer, strict=False)
            addresses.append(peer)
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(peer, None, 0, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            module.fail_json(msg=f"peer {peer}: not an address and not resolvable on this node ({exc}); "
                                 "give the nodes' addresses (torchherd_address)")
        addresses += [info[4][0] for info in infos]
    return split_addresses(addresses)


def apply_rules(module, p):
    """Converges the run's rules on this node to p (the firewall_rules options); the result
    fields of firewall_rules. Fails the module with a message saying what to fix."""
    run_id = p["run_id"]
    if not RUN_ID.match(run_id):
        module.fail_json(msg=f"run_id {run_id!r}: expected letters, digits, '.', '_' or '-'")
    try:
        ports = parse_ports(p["ports"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    v4, v6 = resolve(module, p["peers"]) if p["state"] == "present" else ([], [])
    peers = list(v4) + list(v6)
    if p["state"] == "present" and p["mode"] == "ports" and peers and not ports:
        module.fail_json(msg="mode ports: expected the ports gloo and NCCL use (and the master "
                             "port on the master), found none; fix: pin them to a range "
                             "(net.ipv4.ip_local_port_range) and list it in ports, or use "
                             "mode members")
    if p["backend"] == "none":
        return dict(changed=False, backends=[], detected={}, rules=[], peers=peers,
                    msg="backend none: the firewall was left as it is")
    if os.geteuid() != 0:
        module.fail_json(msg="reading and changing the firewall needs root: run with become "
                             "(the role's torchherd_firewall_become), or set backend none")
    spec = Spec(run_id, v4, v6, p["mode"], ports) if p["state"] == "present" else None

    lock_path = LOCK_FILE if os.path.isdir(os.path.dirname(LOCK_FILE)) else "/tmp/torchherd-firewall.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = converge(module, Node(module), spec, run_id, p)
    return dict(result, peers=peers)


def converge(module, node, spec, run_id, p):
    iptables = Iptables(node)
    backends = {
        "nftables": Nftables(node),
        "iptables": iptables,
        "ufw": Ufw(node, iptables),
        "firewalld": Firewalld(node, p["persistent"]),
    }
    detected = {name: ("active" if b.active else "inactive") if b.installed else "missing"
                for name, b in backends.items()}
    if p["backend"] != "auto":
        if not backends[p["backend"]].usable:
            module.fail_json(msg=f"backend {p['backend']}: not found (or not running) on this node",
                             detected=detected)
        chosen = [p["backend"]] if spec is not None else []
        touched = [p["backend"]]
    else:
        chosen = [] if spec is None else choose_backends(
            backends["firewalld"].active, backends["ufw"].active,
            backends["nftables"].active, backends["iptables"].active)
        # Rules of the run left in a backend that is not (or no longer) chosen go too.
        touched = [name for name, b in backends.items() if b.usable]
    if run_id in backends["firewalld"].ledgers and not backends["firewalld"].running:
        module.warn(f"firewalld is not running: its rules of run {run_id} (ledger in {LEDGER_DIR}) "
                    "cannot be changed now; start firewalld and apply or remove them again")

    plans = {name: backends[name].plan(spec if name in chosen else None, run_id, p["persistent"])
             for name in touched}

    files, commands = {}, []
    if spec is not None and p["persistent"]:
        for name in chosen:
            if name in ("nftables", "iptables"):
                more_files, more_commands = backends[name].boot(spec, run_id)
                files.update(more_files)
                commands += more_commands
    boot, unit = boot_plan(run_id, files, commands)
    if "ufw" in chosen and not p["persistent"] and plans["ufw"][0].changed:
        module.warn(f"ufw keeps every rule across a reboot: the rules of run {run_id} stay until it is "
                    "torn down (state=absent)")

    every = [plan for name in touched for plan in plans[name]] + [boot]
    changed = any(plan.changed for plan in every)
    for plan in every:
        if plan.note:
            module.warn(plan.note)
    if changed and not module.check_mode:
        for name in touched:
            backends[name].apply(plans[name])
        if boot.changed:
            apply_boot(node, boot, unit)

    before = [line for plan in every for line in plan.before]
    after = [line for plan in every for line in plan.after]
    if spec is not None and not chosen:
        found = ", ".join(f"{name} {what}" for name, what in sorted(detected.items()))
        msg = f"no firewall is active on this node ({found}): nothing to open"
    else:
        counts = [f"{plan.backend}: {len(plan.before)} rule(s) before, {len(plan.after)} after"
                  for plan in every if plan.before or plan.after]
        msg = "; ".join(counts) or f"run {run_id} has no rules on this node"
    held = [name for name in touched if any(plan.before for plan in plans[name])]
    return dict(changed=changed, backends=chosen if spec is not None else held, detected=detected,
                rules=sorted(after), msg=msg, diff=diff(before, after))
