"""What the backends share (names, input, the plan), choosing backends, and the one entry
point, converge_rules, with its errors."""

import json

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils import _firewall as fw
from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import common

# ---------------------------------------------------------------------------------------------
# Names and input


def test_addresses_are_normalized_deduplicated_and_split_by_version():
    found = ["10.0.0.3", "10.0.0.2", "fd00::0002", "10.1.0.0/16", "10.0.0.2/32"]
    assert common.split_addresses(found) == (["10.0.0.2", "10.0.0.3", "10.1.0.0/16"], ["fd00::2"])


def test_ports_and_ranges_parse_sorted_and_bad_ones_are_refused():
    assert common.parse_ports(["40000-40100", "29500", "29500", "41000:41001"]) == [
        (29500, 29500), (40000, 40100), (41000, 41001)]
    for bad in ("0", "70000", "5-4", "http", "1-2-3"):
        with pytest.raises(ValueError, match="port"):
            common.parse_ports([bad])


def test_run_tags_keep_short_ids_and_cut_long_ones_distinctly():
    assert common.run_tag("20261121-105606-985c") == "torchherd:20261121-105606-985c"
    a, b = "x" * 100, "x" * 99 + "y"
    assert common.tag_id(a) != common.tag_id(b)
    # An nftables comment holds 128 bytes: tag, ':' and the fingerprint always fit.
    assert len(common.rule_comment(a, "rule")) <= 128
    assert common.RUN_ID.match("20261121-105606-985c") and not common.RUN_ID.match("a b")


def test_diff_lists_lines_sorted():
    assert common.diff(["b", "a"], []) == {"before": "a\nb\n", "after": ""}


# ---------------------------------------------------------------------------------------------
# Choosing


@pytest.mark.parametrize(("found", "chosen"), [
    ((False, False, False, False), []),
    ((False, False, True, False), ["nftables"]),
    ((False, False, True, True), ["nftables", "iptables"]),
    ((False, True, False, True), ["ufw"]),  # ufw's rules live in iptables
    ((True, True, False, True), ["firewalld"]),
    ((False, True, True, True), ["ufw", "nftables"]),  # an admin's own nft table filters too
])
def test_every_firewall_that_can_drop_the_jobs_packets_gets_the_rules(found, chosen):
    assert fw.choose_backends(*found) == chosen


# ---------------------------------------------------------------------------------------------
# The entry point, on a node with nft only (other tools missing)

DROP_INPUT = {"nftables": [
    {"metainfo": {"json_schema_version": 1}},
    {"chain": {"family": "inet", "table": "filter", "name": "input", "handle": 1,
               "type": "filter", "hook": "input", "prio": 0, "policy": "drop"}},
]}


class Module:
    """What Runner takes from AnsibleModule; nft answers `nft_rc`, every other tool is missing."""

    def __init__(self, check_mode=False, nft_rc=0):
        self.check_mode = check_mode
        self.nft_rc = nft_rc
        self.calls = []
        self.warnings = []

    def get_bin_path(self, name):
        return "/usr/sbin/nft" if name == "nft" else None

    def run_command(self, argv, data=None, binary_data=False):
        self.calls.append(argv)
        if self.nft_rc:
            return self.nft_rc, "", "netlink: Error: Operation not permitted\n"
        return 0, json.dumps(DROP_INPUT) if "list" in argv else "", ""

    def warn(self, msg):
        self.warnings.append(msg)


PARAMS = dict(state="present", run_id="run-1", peers=["10.0.0.2"], mode="members", ports=[],
              backend="auto", persistent=False)


@pytest.fixture
def root(monkeypatch, tmp_path):
    monkeypatch.setattr(fw.os, "geteuid", lambda: 0)
    monkeypatch.setattr(fw, "LOCK_FILE", str(tmp_path / "torchherd-firewall.lock"))


def test_a_failing_command_raises_firewall_error_with_its_output():
    with pytest.raises(common.FirewallError) as info:
        common.Runner(Module(nft_rc=1)).run(["/usr/sbin/nft", "-j", "list", "ruleset"],
                                            what="nft -j list ruleset")
    assert str(info.value) == ("nft -j list ruleset failed (exit code 1): "
                               "netlink: Error: Operation not permitted")
    assert info.value.details == {"cmd": ["/usr/sbin/nft", "-j", "list", "ruleset"]}


def test_converge_rules_raises_what_a_failing_read_says(root):
    with pytest.raises(common.FirewallError, match=r"^nft -j list ruleset failed \(exit code 1\)"):
        fw.converge_rules(fw.Runner(Module(nft_rc=1)), PARAMS)


def test_converge_rules_plans_in_check_mode_and_applies_otherwise(root):
    module = Module(check_mode=True)
    result = fw.converge_rules(fw.Runner(module), PARAMS)
    assert result["changed"] and result["backends"] == ["nftables"]
    assert result["detected"] == {"nftables": "active", "iptables": "missing", "ufw": "missing",
                                  "firewalld": "missing"}
    rule = "ip saddr 10.0.0.2 meta l4proto tcp accept"
    assert result["rules"] == [
        f'nftables inet filter input: {rule} comment "{common.rule_comment("run-1", rule)}"']
    assert [argv[1:3] for argv in module.calls] == [["-j", "list"]]
    module = Module()
    assert fw.converge_rules(fw.Runner(module), PARAMS)["changed"]
    assert module.calls[-1] == ["/usr/sbin/nft", "-j", "-f", "-"]


@pytest.mark.parametrize(("change", "message"), [
    (dict(run_id="a b"), "run_id 'a b': expected letters, digits"),
    (dict(ports=["http"]), "port 'http': expected a port"),
    (dict(mode="ports"), "mode ports: expected the ports gloo and NCCL use"),
    (dict(backend="firewalld"), "backend firewalld: not found (or not running) on this node"),
])
def test_converge_rules_refuses_bad_input_with_what_to_fix(root, change, message):
    with pytest.raises(common.FirewallError) as info:
        fw.converge_rules(fw.Runner(Module()), dict(PARAMS, **change))
    assert str(info.value).startswith(message)


def test_converge_rules_needs_root_unless_backend_none(monkeypatch):
    monkeypatch.setattr(fw.os, "geteuid", lambda: 1000)
    with pytest.raises(common.FirewallError, match="needs root"):
        fw.converge_rules(fw.Runner(Module()), PARAMS)
    left = fw.converge_rules(fw.Runner(Module()), dict(PARAMS, backend="none"))
    assert not left["changed"] and left["peers"] == ["10.0.0.2"]


def test_the_process_runner_runs_argv_lists_and_raises_what_to_fix(tmp_path, monkeypatch):
    """The supervisor's runner: the same contract as the module's, with subprocess."""
    from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.common import (
        FirewallError,
        ProcessRunner,
    )

    said = []
    runner = ProcessRunner(said.append)
    assert runner.check_mode is False
    runner.warn("careful")
    assert said == ["careful"]
    # Tools in sbin are found even where PATH leaves sbin out (as get_bin_path does).
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(ProcessRunner, "SBIN", (str(tmp_path / "sbin"),))
    (tmp_path / "sbin").mkdir()
    tool = tmp_path / "sbin" / "fwtool"
    tool.write_text("#!/bin/sh\ncat; echo \" $*\"; [ \"$1\" = ok ] || { echo bad >&2; exit 3; }\n")
    tool.chmod(0o755)
    assert runner.which("fwtool") == str(tool)
    assert runner.which("no-such-tool") is None
    assert runner.run([str(tool), "ok"], data="rules") == "rules ok\n"
    with pytest.raises(FirewallError) as failed:
        runner.run([str(tool), "no"], what="fwtool no")
    assert failed.value.msg == "fwtool no failed (exit code 3): bad"
    assert failed.value.details == {"cmd": [str(tool), "no"]}
    assert runner.probe([str(tool), "no"]) == (3, " no\n", "bad\n")
    assert runner.probe([str(tmp_path / "missing")])[0] == 127
