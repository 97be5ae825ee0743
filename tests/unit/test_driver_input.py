"""What the driver checks and says before and after Ansible: the inventory it hands to
ansible-playbook, and the failure message it reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver import cli
from driver.api import inventory_source
from driver.result import Exit, UsageError


def test_a_file_or_directory_becomes_absolute(tmp_path, monkeypatch):
    (tmp_path / "cluster.ini").write_text("[torchherd_nodes]\nnode0\n")
    (tmp_path / "inv").mkdir()
    monkeypatch.chdir(tmp_path)
    assert inventory_source("cluster.ini") == str(tmp_path / "cluster.ini")
    assert inventory_source(Path("inv")) == str(tmp_path / "inv")


def test_a_tilde_is_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "hosts.ini").write_text("node0\n")
    assert inventory_source("~/hosts.ini") == str(tmp_path / "hosts.ini")


def test_an_inline_host_list_is_passed_as_ansible_reads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert inventory_source("node1,node2,") == "node1,node2,"
    assert inventory_source("10.0.0.1,") == "10.0.0.1,"


def test_a_missing_inventory_is_named_before_anything_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="inventory nope.ini: expected an inventory file"):
        inventory_source("nope.ini")
    assert cli.main(["verify", "-i", "nope.ini", "--json", "--", "t.py"]) == Exit.USAGE
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == Exit.USAGE and "inventory nope.ini" in doc["reason"]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_ansible_cores_wrapper_is_stripped_from_the_plans_message():
    from driver.api import _first_message
    from driver.runner import Outcome

    own = "torchherd plan: the job cannot start:\n  - job.nproc_per_node: expected a positive"
    wrapped = ("Task failed: Finalization of task args for 'ansible.builtin.set_fact' failed: "
               "Error while resolving value for 'torchherd_plan': The filter plugin "
               "'torchherd.cluster.plan' failed: " + own)
    failure = {"event": "runner_on_failed",
               "event_data": {"host": "localhost", "res": {"msg": wrapped}}}
    assert _first_message(Outcome(status="failed", rc=2, failures=[failure])) == own
    node = {"event": "runner_on_failed",
            "event_data": {"host": "n1", "res": {"msg": "Task failed."}}}
    assert _first_message(Outcome(status="failed", rc=2, failures=[node])) == "n1: Task failed."
