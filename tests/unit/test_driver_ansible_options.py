"""Ansible's options on the driver's actions: each flag as ansible-playbook's own would set it,
the passwords asked for kept in the process and answered to Ansible's prompts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from driver import ansible_options, cli
from driver.arguments import build_parser
from driver.result import Exit, UsageError


@pytest.fixture(autouse=True)
def _clean():
    """apply() sets the process's environment, as it does for a run: put it back after."""
    saved = dict(os.environ)
    for name in [*ansible_options._ENV.values(), "ANSIBLE_BECOME"]:
        os.environ.pop(name, None)
    yield
    os.environ.clear()
    os.environ.update(saved)
    ansible_options._answers.clear()
    ansible_options._limit.clear()


def parse(*argv):
    return build_parser().parse_args(list(argv))


def test_each_flag_sets_the_configuration_ansible_playbooks_flag_sets(monkeypatch):
    args = parse("stop", "RUN", "-u", "train", "--private-key", "/k", "-f", "12", "-b",
                 "--become-user", "svc", "--become-method", "su", "--vault-password-file", "/v")
    ansible_options.apply(args, ask=pytest.fail)
    assert {k: os.environ[k] for k in [*ansible_options._ENV.values(), "ANSIBLE_BECOME"]} == {
        "ANSIBLE_REMOTE_USER": "train", "ANSIBLE_PRIVATE_KEY_FILE": "/k",
        "ANSIBLE_FORKS": "12", "ANSIBLE_BECOME_USER": "svc", "ANSIBLE_BECOME_METHOD": "su",
        "ANSIBLE_VAULT_PASSWORD_FILE": "/v", "ANSIBLE_BECOME": "True"}
    assert ansible_options.prompt_answers() == ([], {})


def test_flags_not_given_leave_the_users_configuration_alone():
    ansible_options.apply(parse("launch", "-i", "inv", "--", "t.py"), ask=pytest.fail)
    assert not any(k in os.environ for k in ansible_options._ENV.values())


def test_passwords_are_asked_once_and_answered_to_ansibles_prompts():
    asked = []
    ansible_options.apply(parse("verify", "-i", "inv", "-K", "-J"),
                          ask=lambda prompt: asked.append(prompt) or f"pw{len(asked)}")
    assert asked == ["BECOME password: ", "Vault password: "]
    flags, answers = ansible_options.prompt_answers()
    assert flags == ["--ask-become-pass", "--ask-vault-pass"]
    assert answers == {ansible_options.BECOME_PROMPT: "pw1", ansible_options.VAULT_PROMPT: "pw2"}
    assert sorted(ansible_options.passwords()) == ["pw1", "pw2"]


def test_logs_keeps_f_for_follow_and_every_node_action_has_the_options():
    assert parse("logs", "RUN", "-f", "--forks", "3").follow is True
    for argv in (["launch", "-i", "x"], ["verify", "-i", "x"], ["status", "R"], ["stop", "R"],
                 ["collect", "R"], ["stacks", "R"], ["logs", "R"], ["runs", "--prune"]):
        args = parse(*argv, "-u", "someone", "--vault-password-file", "/v")
        assert (args.user, args.vault_password_file) == ("someone", "/v"), argv


def test_every_node_action_takes_a_limit_as_ansible_playbook_spells_it():
    for argv in (["launch", "-i", "x"], ["verify", "-i", "x"], ["status", "R"], ["stop", "R"],
                 ["collect", "R"], ["stacks", "R"], ["logs", "R"], ["runs", "--prune"]):
        assert parse(*argv, "-l", "node0").limit == "node0", argv
        assert parse(*argv, "--limit", "gpu:!node3").limit == "gpu:!node3", argv


def test_the_limit_goes_to_ansible_playbook_with_localhost_where_the_plan_runs():
    assert ansible_options.limit_flags() == []
    ansible_options.apply(parse("launch", "-i", "inv", "-l", "node0,node2", "--", "t.py"),
                          ask=pytest.fail)
    assert ansible_options.limit_flags() == ["--limit", "node0,node2,localhost"]
    # Not an environment variable: ansible-core has no setting for the limit.
    assert not any("LIMIT" in name or "SUBSET" in name for name in os.environ)


@pytest.mark.parametrize(("given", "passed"), [
    ("gpu:!node3", "gpu,!node3,localhost"),  # Ansible's terms, split as it splits them
    ("!node3", "all,!node3,localhost"),  # exclusions alone: all hosts but those, as Ansible
    ("node0,localhost", "node0,localhost"),
    ("~node[01]", "~node[01],localhost"),
])
def test_a_limit_keeps_its_meaning_and_localhost(given, passed):
    assert ansible_options.limit_pattern(given) == passed


def test_a_limit_file_is_read_as_ansible_reads_it(tmp_path):
    limit = tmp_path / "retry"
    limit.write_text("node0\n\n  node2  \n")
    assert ansible_options.limit_pattern(f"@{limit}") == "node0,node2,localhost"
    with pytest.raises(UsageError, match=r"--limit @/nonexistent: expected a readable limit "
                                         r"file /nonexistent, found .*; fix:"):
        ansible_options.limit_pattern("@/nonexistent")


@pytest.mark.parametrize(("given", "term"), [("gpu:&rack1", "&rack1"),
                                             ("all:!localhost", "!localhost")])
def test_a_limit_that_would_leave_out_localhost_is_refused_not_changed(given, term):
    """Localhost added to an intersection would be cut by it, and to its own exclusion removed
    by it: the plan would not run."""
    with pytest.raises(UsageError, match=f"--limit {given}: expected a pattern that keeps "
                                         f"localhost .*, found '{term}'.*; fix: name the hosts"):
        ansible_options.limit_pattern(given)


def test_a_bad_limit_is_a_usage_error_before_anything_runs(capsys):
    assert cli.main(["verify", "-i", "node0,", "-l", "gpu:&rack1", "--json"]) == Exit.USAGE
    assert "expected a pattern that keeps localhost" in json.loads(capsys.readouterr().out)[
        "reason"]


def test_runs_takes_a_limit_only_with_prune(capsys):
    assert cli.main(["runs", "-l", "node0"]) == Exit.USAGE
    assert "runs -l: expected it with --prune" in capsys.readouterr().err


def test_a_limit_that_leaves_out_a_needed_node_is_refused_by_the_plan(tmp_path):
    """Through ansible-playbook's own --limit, ansible_limit and the plan, on an inline host
    list (hosts in no group) and with no node touched: the plan refuses before any."""
    done = subprocess.run(
        [sys.executable, "-m", "driver", "verify", "-i", "node0,node1,", "-l", "node0",
         "--runs-dir", str(tmp_path / "runs"), "--json"],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=120,
        check=False, env={k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")})
    assert done.returncode == Exit.USAGE, done.stderr[-2000:]
    reason = json.loads(done.stdout)["reason"]
    assert ("host node1: expected within the limit node0,localhost (the job's 2 nodes), found "
            "it outside, and no spare within the limit to take its place; fix: widen the limit "
            "to take in node1") in reason, reason
