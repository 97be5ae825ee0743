"""The user's own Ansible configuration and SSH trust decide how nodes are reached."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.integration.helpers import EXAMPLES

pytestmark = pytest.mark.cluster


def torchherd(cwd, *args):
    """The CLI as a user runs it, in cwd, with no Ansible settings from the suite but the
    directory of the test's own SSH masters (own_masters)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ANSIBLE_") or k == "ANSIBLE_SSH_CONTROL_PATH_DIR"}
    done = subprocess.run([sys.executable, "-m", "driver", args[0], "--json", *map(str, args[1:])],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    return done.returncode, json.loads(done.stdout)


def launch(cwd, inventory, run_id):
    return torchherd(cwd, "launch", "-i", inventory, "--code-src", EXAMPLES, "--run-id", run_id,
                     "--nproc-per-node", "1", "--", "allreduce.py")


def test_private_key_from_the_users_ansible_cfg(cluster3, tmp_path, own_masters):
    """The inventory names no key; the user's ./ansible.cfg does, and the launch uses it."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(re.sub(r"^ansible_ssh_private_key_file=.*\n", "",
                                cluster3.inventory.read_text(), flags=re.MULTILINE))
    assert "private_key_file" not in inventory.read_text()
    code, result = launch(tmp_path, inventory, "userkey-without")
    assert code == 5, result["reason"]  # unreachable: no key, the nodes do not let us in
    assert all(p["check"] == "ssh" for p in result["problems"]), result["problems"]

    (tmp_path / "ansible.cfg").write_text(f"[defaults]\nprivate_key_file = {cluster3.key}\n")
    code, result = launch(tmp_path, inventory, "userkey-with")
    assert code == 0, result["reason"]
    assert {h["state"] for h in result["hosts"].values()} == {"succeeded"}


def test_unknown_host_key_stops_before_any_change(cluster3, tmp_path, own_masters):
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(cluster3.inventory.read_text().replace(
        str(cluster3.inventory.parent / "known_hosts"), str(tmp_path / "known_hosts")))
    code, result = launch(tmp_path, inventory, "hostkey-unknown")
    assert code == 3, result["reason"]
    problems = {p["host"]: p for p in result["problems"]}
    assert sorted(problems) == sorted(n.name for n in cluster3.nodes)
    for node in cluster3.nodes:
        problem = problems[node.name]
        assert problem["check"] == "ssh host key"
        assert f"ssh-keyscan {node.ip}" in problem["fix"]
        touched = cluster3.exec(node, ["test", "-e", "/root/.torchherd/runs/hostkey-unknown"],
                                check=False)
        assert touched.returncode != 0, f"{node.name} was changed"
    assert not (tmp_path / "known_hosts").exists() or not (tmp_path / "known_hosts").read_text()

    # Checking off is the user's explicit choice, and then the launch goes ahead.
    (tmp_path / "ansible.cfg").write_text("[defaults]\nhost_key_checking = False\n")
    code, result = launch(tmp_path, inventory, "hostkey-off")
    assert code == 0, result["reason"]


def test_nodes_reached_only_through_a_bastion(make_cluster, tmp_path):
    """SSH from the controller to the nodes is refused; the user's ansible.cfg sends it through
    a bastion (ProxyCommand in ssh_args). Launch, sync, start, watch, collect, a detached job's
    stop: all go through it."""
    cluster = make_cluster("bastion", 2, extra=["bastion"])
    bastion = cluster.node("bastion")
    controller = bastion.ip.rsplit(".", 1)[0] + ".1"  # this host, on the cluster's network
    for node in cluster.nodes:
        for argv in (["add", "table", "inet", "bastion_test"],
                     ["add", "chain", "inet", "bastion_test", "input",
                      "{ type filter hook input priority -10 ; policy accept ; }"],
                     ["add", "rule", "inet", "bastion_test", "input", "ip", "saddr", controller,
                      "tcp", "dport", "22", "reject", "with", "tcp", "reset"]):
            cluster.exec(node, ["nft", *argv])
        direct = subprocess.run([*cluster.ssh_argv(node), "true"], capture_output=True,
                                text=True, check=False)
        assert direct.returncode != 0, f"{node.name} still answers SSH from the controller"

    known_hosts = cluster.inventory.parent / "known_hosts"
    jump = (f"ssh -i {cluster.key} -o UserKnownHostsFile={known_hosts} -o BatchMode=yes "
            f"-W %h:%p root@{bastion.ip}")
    (tmp_path / "ansible.cfg").write_text(
        "[ssh_connection]\n"
        f"ssh_args = -o ControlMaster=auto -o ControlPersist=60s -o ProxyCommand=\"{jump}\"\n")
    code, result = launch(tmp_path, cluster.inventory, "bastion-launch")
    assert code == 0, result["reason"]
    assert {h["state"] for h in result["hosts"].values()} == {"succeeded"}
    assert result["sync"]["nodes_sent_to"] == 2
    assert all(h["logs_fetched"] for h in result["hosts"].values())

    code, result = torchherd(tmp_path, "launch", "-i", cluster.inventory, "--code-src",
                             EXAMPLES, "--run-id", "bastion-detached", "--nproc-per-node", "1",
                             "--detach", "--", "allreduce.py", "--sleep", "300")
    assert code == 0, result["reason"]
    code, result = torchherd(tmp_path, "stop", "bastion-detached")
    assert code == 0, result["reason"]
    for node in cluster.nodes:
        assert cluster.pids(node, r"torch\.distributed\.run|allreduce\.py") == []
