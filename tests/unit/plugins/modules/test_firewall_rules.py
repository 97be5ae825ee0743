"""The firewall code at the modules' edges: a FirewallError ends firewall_rules once, with
fail_json, its message and its details; at the end of torchrun_job's wait it is reported,
never the job's failure. (The firewall code itself is tested under
tests/unit/plugins/module_utils/firewall.)"""


import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.torchherd.cluster.plugins.module_utils import _firewall as fw
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.wait import close_firewall
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    read_record,
    rules_open,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record
from ansible_collections.torchherd.cluster.plugins.modules import firewall_rules

FAILED = "nft -j list ruleset failed (exit code 1): Error: Operation not permitted"


class Ended(Exception):
    def __init__(self, how, result):
        super().__init__(how)
        self.how = how
        self.result = result


@pytest.fixture
def module(monkeypatch, tmp_path):
    """Runs firewall_rules as root on a node whose only firewall tool, nft, fails."""
    def end(how):
        def raise_(_self, **result):
            raise Ended(how, result)
        return raise_
    monkeypatch.setattr(AnsibleModule, "exit_json", end("exit_json"))
    monkeypatch.setattr(AnsibleModule, "fail_json", end("fail_json"))
    monkeypatch.setattr(AnsibleModule, "get_bin_path", lambda _self, name, *_args, **_kwargs:
                        "/usr/sbin/nft" if name == "nft" else None)
    monkeypatch.setattr(AnsibleModule, "run_command",
                        lambda _self, argv, **kwargs: (1, "", "Error: Operation not permitted\n"))
    monkeypatch.setattr(fw.os, "geteuid", lambda: 0)
    monkeypatch.setattr(fw, "LOCK_FILE", str(tmp_path / "torchherd-firewall.lock"))

    def run(**args):
        with patch_module_args(args), pytest.raises(Ended) as ended:
            firewall_rules.main()
        return ended.value.how, ended.value.result
    return run


def test_a_failing_command_fails_the_module_with_its_message_and_argv(module):
    how, result = module(run_id="run-1", peers=["10.0.0.2"])
    assert how == "fail_json"
    assert result["msg"] == FAILED
    assert result["cmd"] == ["/usr/sbin/nft", "-j", "list", "ruleset"]


def test_bad_input_fails_the_module_with_what_to_fix(module):
    how, result = module(run_id="a b")
    assert how == "fail_json" and result["msg"].startswith("run_id 'a b': expected letters")


def test_backend_none_leaves_the_firewall_alone(module):
    how, result = module(run_id="run-1", peers=["10.0.0.2"], backend="none")
    assert how == "exit_json" and not result["changed"]
    assert result["msg"] == "backend none: the firewall was left as it is"


def test_rules_that_torchrun_job_cannot_remove_are_reported_not_failed(module, monkeypatch,
                                                                      tmp_path):
    warnings = []
    monkeypatch.setattr(AnsibleModule, "warn", lambda _self, msg: warnings.append(msg))
    with patch_module_args({}):
        job = AnsibleModule(argument_spec={})
    firewall = dict(peers=["10.0.0.2"], mode="members", ports=[], backend="auto", persistent=False)
    paths = {"dir": str(tmp_path)}
    closed = close_firewall(job, {"run_id": "run-1", "firewall": firewall}, paths)
    assert closed == {"changed": False, "error": FAILED}
    assert warnings == [f"the rules of run run-1 could not be removed here: {FAILED}"]
    # The record keeps the wait's try and its error: the teardown still visits this node.
    fw = read_record(paths)["firewall"]
    assert fw["closed_by"] == "wait" and fw["error"] == FAILED


def test_the_wait_takes_the_supervisors_removal_and_tries_again_after_its_error(
        module, monkeypatch, tmp_path):
    """The supervisor removes the start's rules when the job ends (the run-state record); the
    wait runs no firewall command then, and removes them itself where the supervisor could not."""
    commands = []
    monkeypatch.setattr(AnsibleModule, "run_command", lambda _self, argv, **kwargs: (
        commands.append(argv) or (1, "", "Error: Operation not permitted\n")))
    monkeypatch.setattr(AnsibleModule, "warn", lambda _self, msg: None)
    with patch_module_args({}):
        job = AnsibleModule(argument_spec={})
    firewall = dict(peers=["10.0.0.2"], mode="members", ports=[], backend="auto", persistent=False)
    paths = {"dir": str(tmp_path)}
    record(paths, "firewall", opened_by="start", rules=["nft: accept from 10.0.0.2"])
    record(paths, "firewall", closed_by="supervisor", changed=True, error=None)
    p = {"run_id": "run-1", "firewall": firewall}
    assert close_firewall(job, p, paths) == {"changed": False, "closed_by": "supervisor"}
    assert commands == []
    assert rules_open(read_record(paths)) == []
    record(paths, "firewall", closed_by="supervisor", changed=False, error="nft: gone")
    assert rules_open(read_record(paths)) == ["nft: accept from 10.0.0.2"]
    closed = close_firewall(job, p, paths)
    assert closed == {"changed": False, "error": FAILED}
    assert commands == [["/usr/sbin/nft", "-j", "list", "ruleset"]]
