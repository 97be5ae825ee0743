# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The firewall of one node: which rules a run needs, in which backends, and converging them.
One entry point, converge_rules, shared by the firewall_rules module and by torchrun_job,
which opens the job's rules in its start's own round trip where it runs as root anyway.

Each backend (nftables, iptables, ufw, firewalld) has a file of its own holding how it finds
a run's rules again, its planner (pure) and its I/O (reading the node, applying the plan);
common holds what they share. Failures raise FirewallError, with a message saying what to fix.

Runs on the nodes: Python 3.8 and later.
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.common import (
    BOOT_DIR,
    BOOT_SUFFIXES,
    LEDGER_DIR,
    RUN_ID,
    FirewallError,
    Plan,
    ProcessRunner,
    Runner,
    Spec,
    diff,
    parse_ports,
    read_text,
    remove,
    split_addresses,
    write_text,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.firewalld import Firewalld
from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.iptables import Iptables
from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.nftables import Nftables
from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.ufw import Ufw

__all__ = ["RULE_OPTIONS", "FirewallError", "ProcessRunner", "Runner", "close_rules",
           "converge_rules"]

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
UNIT_DIR = "/etc/systemd/system"


def choose_backends(firewalld_running, ufw_active, nft_blocking, iptables_blocking_):
    """The backends to put the run's rules in: every one that can drop the job's packets, as a
    packet must pass them all. firewalld (when running) or else ufw (when active) manage the
    firewall and get the rules in their own terms; iptables rules are theirs then (ufw's live
    in iptables). nftables tables of the administrator's own filter besides them."""
    manager = "firewalld" if firewalld_running else "ufw" if ufw_active else None
    chosen = [manager] if manager else []
    if nft_blocking:
        chosen.append("nftables")
    if iptables_blocking_ and not manager:
        chosen.append("iptables")
    return chosen


# ---------------------------------------------------------------------------------------------
# Persistence: the nftables and iptables rules of a run, loaded at boot by a unit of its own


def unit_name(run_id):
    return f"torchherd-firewall-{run_id}.service"


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


def apply_boot(runner, plan, unit):
    systemctl = runner.which("systemctl")
    if not systemctl:
        raise FirewallError("persistent rules need systemd (no systemctl on this node)")
    for verb, path, text in plan.actions:
        if verb == "write":
            write_text(path, text, 0o600 if path.startswith(BOOT_DIR) else 0o644)
        else:
            if path == unit:
                runner.run([systemctl, "disable", os.path.basename(unit)])
            remove(path)
    runner.run([systemctl, "daemon-reload"])
    if os.path.exists(unit):
        runner.run([systemctl, "enable", os.path.basename(unit)])


# ---------------------------------------------------------------------------------------------


def resolve(peers):
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
            raise FirewallError(f"peer {peer}: not an address and not resolvable on this node ({exc}); "
                                "give the nodes' addresses (torchherd_address)") from exc
        addresses += [info[4][0] for info in infos]
    return split_addresses(addresses)


def converge_rules(runner, p):
    """Converges the run's rules on this node to p (firewall_rules's options: state, run_id
    and RULE_OPTIONS); returns firewall_rules's result fields. Raises FirewallError with a
    message saying what to fix."""
    run_id = p["run_id"]
    if not RUN_ID.match(run_id):
        raise FirewallError(f"run_id {run_id!r}: expected letters, digits, '.', '_' or '-'")
    try:
        ports = parse_ports(p["ports"])
    except ValueError as exc:
        raise FirewallError(str(exc)) from exc
    v4, v6 = resolve(p["peers"]) if p["state"] == "present" else ([], [])
    peers = list(v4) + list(v6)
    if p["state"] == "present" and p["mode"] == "ports" and peers and not ports:
        raise FirewallError("mode ports: expected the ports gloo and NCCL use (and the master "
                            "port on the master), found none; fix: pin them to a range "
                            "(net.ipv4.ip_local_port_range) and list it in ports, or use "
                            "mode members")
    if p["backend"] == "none":
        return dict(changed=False, backends=[], detected={}, rules=[], peers=peers,
                    msg="backend none: the firewall was left as it is")
    if os.geteuid() != 0:
        raise FirewallError("reading and changing the firewall needs root: run with become "
                            "(the role's torchherd_firewall_become), or set backend none")
    spec = Spec(run_id, v4, v6, p["mode"], ports) if p["state"] == "present" else None

    lock_path = LOCK_FILE if os.path.isdir(os.path.dirname(LOCK_FILE)) else "/tmp/torchherd-firewall.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = _converge(runner, spec, run_id, p)
    return dict(result, peers=peers)


def close_rules(runner, run_id, options):
    """Removes the run's rules (converge_rules with state absent and the rule options the start
    was given): what was removed, or {"changed": False, "error": why}, since a rule that cannot
    be removed must not hide the job's own end."""
    try:
        return converge_rules(runner, dict(options, state="absent", run_id=run_id))
    except FirewallError as exc:
        return {"changed": False, "error": str(exc)}


def _converge(runner, spec, run_id, p):
    iptables = Iptables(runner)
    backends = {
        "nftables": Nftables(runner),
        "iptables": iptables,
        "ufw": Ufw(runner, iptables),
        "firewalld": Firewalld(runner, p["persistent"]),
    }
    detected = {name: ("active" if b.active else "inactive") if b.installed else "missing"
                for name, b in backends.items()}
    if p["backend"] != "auto":
        if not backends[p["backend"]].usable:
            raise FirewallError(f"backend {p['backend']}: not found (or not running) on this node",
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
        runner.warn(f"firewalld is not running: its rules of run {run_id} (ledger in {LEDGER_DIR}) "
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
        runner.warn(f"ufw keeps every rule across a reboot: the rules of run {run_id} stay until it is "
                    "torn down (state=absent)")

    every = [plan for name in touched for plan in plans[name]] + [boot]
    changed = any(plan.changed for plan in every)
    for plan in every:
        if plan.note:
            runner.warn(plan.note)
    if changed and not runner.check_mode:
        for name in touched:
            backends[name].apply(plans[name])
        if boot.changed:
            apply_boot(runner, boot, unit)

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
