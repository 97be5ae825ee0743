"""Secrets out of ansible-runner events before anyone sees them, and ansible-playbook as the
driver starts it (driver.runner)."""

import os
import subprocess
import sys

from driver.runner import _ansible_playbook, scrub, secret_values


def _playbook_process(*args):
    binary, leading = _ansible_playbook("launch")
    return subprocess.run([binary, *leading[:2], *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_ansible_playbook_runs_as_python_m_ansible_would_with_its_own_arguments():
    binary, leading = _ansible_playbook("launch")
    assert binary == sys.executable
    assert leading[2:] == [str(os.getpid()), "playbook", "torchherd.cluster.launch"]
    done = _playbook_process(str(os.getpid()), "playbook", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ansible-playbook [core "), done.stdout


def test_ansible_playbook_does_not_start_where_its_driver_is_gone():
    # The parent named is not this process's: as if the driver had died before the tie was set.
    done = _playbook_process("1", "playbook", "--version")
    assert done.returncode == 128 + 15 and done.stdout == "", (done.returncode, done.stdout)
    # Untied ("-", where the system has no parent-death signal), it runs whatever its parent.
    assert _playbook_process("-", "playbook", "--version").returncode == 0


def test_secret_values_found_at_any_depth():
    extravars = {"torchherd_job": {"env": {"A": "plain"},
                                   "secret_env": {"K": "abc", "T": "abcdef", "N": 42}}}
    assert secret_values(extravars) == ["abcdef", "abc", "42"]
    assert secret_values({"torchherd_run_id": "r1"}) == []


def test_scrub_replaces_values_in_every_string_and_keeps_the_rest():
    event = {"event": "runner_on_ok", "stdout": "ok: [n0] => {'K': 'abcdef'}",
             "event_data": {"res": {"ansible_facts": {"torchherd_plan": {"job": {
                 "secret_env": {"K": "abcdef"}, "master_port": 29500}}}},
                 "hosts": ["n0", "xabcx"]}}
    clean = scrub(event, ["abcdef", "abc"])
    assert "abc" not in repr(clean)
    assert clean["stdout"] == "ok: [n0] => {'K': '********'}"
    assert clean["event_data"]["res"]["ansible_facts"]["torchherd_plan"]["job"] == {
        "secret_env": {"K": "********"}, "master_port": 29500}
    assert clean["event_data"]["hosts"] == ["n0", "x********x"]
    assert event["stdout"].endswith("'abcdef'}")  # the original is untouched
    assert scrub(event, []) is event
