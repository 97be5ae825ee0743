# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The pure part of firewall_rules: which rules a run needs, which ones it owns, and the plan
that turns one into the other, for each backend. Nothing here runs a command.

How a run's rules are found again, so that teardown removes exactly them:
  - nftables and iptables: a comment "torchherd:<run>:<fingerprint>" on each rule (iptables
    also a chain of the run's own). The fingerprint hashes the rule, so comparing comments
    tells whether the rules are already the wanted ones.
  - ufw keeps one rule for identical specs whatever their comments, so runs needing the same
    rule share it: its comment "torchherd:<run>,<run>,..." lists them, and the last run to
    leave deletes it.
  - firewalld rich rules take no comment: a ledger file per run lists the rules it needs and
    whether it (or another run) added them, or found them already there (then never removes
    them).

Runs on the nodes: Python 3.8 and later.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
import shlex

TAG = "torchherd:"
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# nftables comments hold at most 128 bytes: "torchherd:" + id + ":" + 8 hex digits must fit.
MAX_TAG_ID = 64
# iptables chain names hold at most 28 characters.
MAX_CHAIN = 28
# ufw's multiport rules take at most 15 ports, a range counting as two.
UFW_MAX_PORTS = 15
# Verdicts that can stop a packet, directly or in a chain they lead to.
_NFT_STOPPING = ("drop", "reject", "jump", "goto", "queue")


def _sha(text, length=8):
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def tag_id(run_id):
    """The run id as rules name it: whole up to 64 characters, else cut and hashed."""
    if len(run_id) <= MAX_TAG_ID:
        return run_id
    return run_id[:55] + "~" + _sha(run_id)


def run_tag(run_id):
    return TAG + tag_id(run_id)


def rule_comment(run_id, text):
    """Comment of one nftables/iptables rule: the run and a fingerprint of the rule."""
    return f"{run_tag(run_id)}:{_sha(text)}"


def iptables_chain(run_id):
    """The run's own iptables chain: th-<run id>, cut and hashed past 28 characters."""
    name = "th-" + run_id
    if len(name) <= MAX_CHAIN:
        return name
    return f"th-{run_id[:16]}-{_sha(run_id)}"


def unit_name(run_id):
    return f"torchherd-firewall-{run_id}.service"


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
# nftables: rules inserted at the head of every input base chain that can drop


def nft_items(ruleset):
    """The objects of `nft -j list ruleset` output, metainfo left out."""
    return [item for item in ruleset.get("nftables", []) if "metainfo" not in item]


def _foreign(chain):
    # iptables-nft keeps its tables in nftables under these names: its rules are the iptables
    # backend's business, and nft must not edit them ("do not touch"). firewalld's own table
    # is firewalld's business.
    if chain["family"] == "inet" and chain["table"] == "firewalld":
        return True
    return chain["family"] in ("ip", "ip6") and chain["table"] == "filter" and chain["name"] == "INPUT"


def _stops(node):
    if isinstance(node, dict):
        return any(key in _NFT_STOPPING or _stops(value) for key, value in node.items())
    if isinstance(node, list):
        return any(_stops(value) for value in node)
    return False


def _torchherd_comment(rule):
    return str(rule.get("comment", "")).startswith(TAG)


def nft_input_chains(items):
    """Filter base chains on the input hook that can drop a packet (a drop policy, or a rule
    with drop, reject, jump, goto or queue), in tables of nobody but the administrator (not
    iptables-nft's, not firewalld's): [(family, table, chain)]."""
    chains = [i["chain"] for i in items if "chain" in i]
    bases = {
        (c["family"], c["table"], c["name"]): c
        for c in chains
        if c.get("hook") == "input" and c.get("type") == "filter"
        and c["family"] in ("ip", "ip6", "inet") and not _foreign(c)
    }
    stopping = set()
    for key, chain in bases.items():
        if chain.get("policy") == "drop":
            stopping.add(key)
    for item in items:
        rule = item.get("rule")
        if rule is None or _torchherd_comment(rule):
            continue
        key = (rule["family"], rule["table"], rule["chain"])
        if key in bases and _stops(rule.get("expr")):
            stopping.add(key)
    return sorted(stopping)


def nft_rules(spec, family):
    """The run's rules for one base chain of a table of `family`: [(text, comment, expr)]."""
    if spec is None or spec.empty:
        return []
    rules = []
    for version, addresses in spec.families():
        if (family == "ip" and version == 6) or (family == "ip6" and version == 4):
            continue
        proto = "ip" if version == 4 else "ip6"
        expr = [_nft_match({"payload": {"protocol": proto, "field": "saddr"}},
                           {"set": [_nft_address(a) for a in addresses]})]
        if spec.mode == "members":
            expr.append(_nft_match({"meta": {"key": "l4proto"}}, "tcp"))
        else:
            expr.append(_nft_match({"payload": {"protocol": "tcp", "field": "dport"}},
                                   {"set": [low if low == high else {"range": [low, high]}
                                            for low, high in spec.ports]}))
        expr.append({"accept": None})
        text = nft_text(expr)
        rules.append((text, rule_comment(spec.run_id, text), expr))
    return rules


def _nft_match(left, right):
    return {"match": {"op": "==", "left": left, "right": right}}


def _nft_address(address):
    if "/" not in address:
        return address
    addr, length = address.split("/")
    return {"prefix": {"addr": addr, "len": int(length)}}


def _nft_value(value):
    if isinstance(value, dict):
        if "set" in value:
            # One element prints bare, as nft lists it.
            if len(value["set"]) == 1:
                return _nft_value(value["set"][0])
            return "{ " + ", ".join(_nft_value(v) for v in value["set"]) + " }"
        if "range" in value:
            return f"{value['range'][0]}-{value['range'][1]}"
        if "prefix" in value:
            return f"{value['prefix']['addr']}/{value['prefix']['len']}"
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def nft_text(expr):
    """nft syntax of the expressions torchherd writes (others come out as JSON)."""
    words = []
    for statement in expr:
        match = statement.get("match") if isinstance(statement, dict) else None
        if match:
            left = match["left"]
            if "payload" in left:
                key = f"{left['payload']['protocol']} {left['payload']['field']}"
            elif "meta" in left:
                key = f"meta {left['meta']['key']}"
            else:
                key = json.dumps(left)
            op = "" if match["op"] == "==" else " " + match["op"]
            words.append(f"{key}{op} {_nft_value(match['right'])}")
        elif statement == {"accept": None}:
            words.append("accept")
        else:
            words.append(json.dumps(statement))
    return " ".join(words)


def nft_wanted(items, spec):
    """{(family, table, chain, comment): (text, expr)}: the run's rules in every input chain
    that can drop."""
    wanted = {}
    for family, table, chain in nft_input_chains(items) if spec is not None else []:
        for text, comment, expr in nft_rules(spec, family):
            wanted[(family, table, chain, comment)] = (text, expr)
    return wanted


def _nft_insert(key, expr):
    return {"insert": {"rule": {"family": key[0], "table": key[1], "chain": key[2],
                                "comment": key[3], "expr": expr}}}


def nft_plan(items, spec, run_id):
    """Insert the run's rules at the head of every input chain that can drop, delete the run's
    rules that are not wanted. Actions: the commands of one `nft -j -f -` batch."""
    prefix = run_tag(run_id) + ":"
    wanted = nft_wanted(items, spec)

    def line(key, expr):
        return f'nftables {key[0]} {key[1]} {key[2]}: {nft_text(expr)} comment "{key[3]}"'

    before, after, actions, kept = [], [], [], set()
    for item in items:
        rule = item.get("rule")
        if rule is None or not str(rule.get("comment", "")).startswith(prefix):
            continue
        key = (rule["family"], rule["table"], rule["chain"], rule["comment"])
        before.append(line(key, rule.get("expr", [])))
        if key in wanted and key not in kept:
            kept.add(key)
            # Shown as nft lists it, so that an unchanged rule shows no difference.
            after.append(before[-1])
        else:
            actions.append({"delete": {"rule": {"family": key[0], "table": key[1],
                                                "chain": key[2], "handle": rule["handle"]}}})
    for key, (_text, expr) in sorted(wanted.items()):
        if key not in kept:
            actions.append(_nft_insert(key, expr))
            after.append(line(key, expr))
    return Plan("nftables", before, after, actions)


def nft_boot(items, spec):
    """The `nft -j -f FILE` batch that puts the run's rules back at boot."""
    return [_nft_insert(k, expr) for k, (_text, expr) in sorted(nft_wanted(items, spec).items())]


# ---------------------------------------------------------------------------------------------
# iptables: a chain of the run's own, jumped to from the head of INPUT


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


# ---------------------------------------------------------------------------------------------
# ufw: "allow proto tcp from PEER to any [port P]" with the runs in the comment


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


# ---------------------------------------------------------------------------------------------
# firewalld: rich rules in the zone that receives each peer's traffic


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


# ---------------------------------------------------------------------------------------------
# Which backend


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
