"""Ansible's options on the driver's actions: each flag as ansible-playbook's own would set it,
the passwords asked for kept in the process and answered to Ansible's prompts."""

from __future__ import annotations

import os

import pytest

from driver import ansible_options
from driver.arguments import build_parser


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
