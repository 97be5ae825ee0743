# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""nftables: the run's rules inserted at the head of every input base chain that can drop,
each with the comment "torchherd:<run>:<fingerprint>". The fingerprint hashes the rule, so
comparing comments tells whether the rules are already the wanted ones.

Runs on the nodes: Python 3.8 and later.
"""

from __future__ import annotations

import json
import os

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.common import (
    BOOT_DIR,
    TAG,
    Plan,
    rule_comment,
    run_tag,
)

# Verdicts that can stop a packet, directly or in a chain they lead to.
_NFT_STOPPING = ("drop", "reject", "jump", "goto", "queue")


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


class Nftables:
    """The node's nftables ruleset, read once; plans from it and applies the plan."""

    def __init__(self, runner):
        self.runner = runner
        self.nft = runner.which("nft")
        self.items = []
        if self.nft:
            out = runner.run([self.nft, "-j", "list", "ruleset"], what="nft -j list ruleset")
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
                self.runner.run([self.nft, "-j", "-f", "-"],
                                data=json.dumps({"nftables": plan.actions}), what="nft -j -f -")

    def boot(self, spec, run_id):
        """{file: content} and the commands that load them at boot."""
        batch = nft_boot(self.items, spec)
        if not batch:
            return {}, []
        path = os.path.join(BOOT_DIR, run_id + ".nft.json")
        return {path: json.dumps({"nftables": batch}, indent=1) + "\n"}, [[self.nft, "-j", "-f", path]]
