"""Ansible's own options on the driver, with Ansible's meaning: a vaulted job file and a vaulted
inventory with --vault-password-file and with -J (asked on a terminal), a key and a user given
as flags. On the embedded default (inventories/local.ini: two nodes on this machine) and the
shared container cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pexpect
import pytest

from tests.integration.helpers import EXAMPLES, REPO
from tests.integration.local_nodes import LOCAL_INI, NODE_ROOTS

PASSWORD = "correct horse"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}


def _vault(path: Path, password_file: Path) -> None:
    subprocess.run([str(Path(sys.executable).parent / "ansible-vault"), "encrypt",
                    "--vault-password-file", str(password_file), str(path)],
                   check=True, capture_output=True)
    assert path.read_text().startswith("$ANSIBLE_VAULT;")


def _driver(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "driver", *map(str, args)], cwd=cwd,
                          env=_env(), capture_output=True, text=True, timeout=300, check=False)


def test_a_vaulted_job_file_with_a_password_file(tmp_path):
    password_file = tmp_path / "vault-pass"
    password_file.write_text(PASSWORD + "\n")
    job = tmp_path / "job.yml"
    job.write_text(json.dumps({"torchherd_job": {
        "script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 1,
        "runs_dir": str(tmp_path / "runs")}}))
    _vault(job, password_file)

    refused = _driver("verify", "-i", LOCAL_INI, "-j", job, "--json", cwd=tmp_path)
    assert refused.returncode == 2
    assert "expected a vaulted file this driver can decrypt" in refused.stderr
    assert "--vault-password-file" in refused.stderr

    done = _driver("launch", "-i", LOCAL_INI, "-j", job, "--vault-password-file",
                   password_file, "--run-id", f"vault-{uuid.uuid4().hex[:8]}", "--json",
                   cwd=tmp_path)
    result = json.loads(done.stdout)
    assert done.returncode == 0, (result.get("reason"), done.stderr[-2000:])
    assert {h["state"] for h in result["hosts"].values()} == {"succeeded"}

    # The same file with the password asked on a terminal (-J).
    asked = _asked(["verify", "-i", str(LOCAL_INI), "-j", str(job), "-J", "--json"], tmp_path)
    assert asked["exit_name"] == "ok" and len(asked["hosts"]) == 2


def _asked(argv: list[str], cwd: Path) -> dict:
    """The driver run on a terminal that types the vault's password when asked (-J); its JSON
    result. The password shows nowhere in what the terminal got."""
    child = pexpect.spawn(sys.executable, ["-m", "driver", *argv], cwd=str(cwd), env=_env(),
                          encoding="utf-8", timeout=300)
    child.expect("Vault password: ")
    child.sendline(PASSWORD)
    child.expect(pexpect.EOF)
    child.close()
    output = child.before
    assert child.exitstatus == 0, output[-3000:]
    assert PASSWORD not in output
    return json.loads(output[output.index("{"):output.rindex("}") + 1])


def test_a_vaulted_inventory_with_the_password_asked_on_a_terminal(tmp_path):
    """The inventory's job in a vaulted group_vars file: -J asks once, and both the driver's own
    read of the inventory and ansible-playbook get it; it shows nowhere."""
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    shutil.copy(LOCAL_INI, inventory / "hosts.ini")
    # The inventory's own job is now the vaulted file's (local.ini's is the demo's).
    text = (inventory / "hosts.ini").read_text()
    (inventory / "hosts.ini").write_text(re.sub(r"^torchherd_job=.*$", "", text, flags=re.M))
    group_vars = inventory / "group_vars" / "torchherd_nodes.yml"
    group_vars.write_text(json.dumps({"torchherd_job": {
        "script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 1}}))
    password_file = tmp_path / "vault-pass"
    password_file.write_text(PASSWORD + "\n")
    _vault(group_vars, password_file)
    password_file.unlink()

    result = _asked(["launch", "-i", str(inventory / "hosts.ini"), "-J", "--runs-dir",
                     str(tmp_path / "runs"), "--json"], tmp_path)
    assert result["exit_name"] == "ok" and len(result["hosts"]) == 2

    # The same inventory with a password file.
    password_file.write_text(PASSWORD + "\n")
    done = _driver("verify", "-i", inventory / "hosts.ini", "--vault-password-file",
                   password_file, "--runs-dir", tmp_path / "runs", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads(done.stdout)["exit_name"] == "ok"


@pytest.mark.cluster
def test_the_key_and_the_user_as_flags(cluster3, tmp_path):
    """An inventory that names neither: -u and --private-key, as ansible-playbook takes them."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(re.sub(r"^(ansible_user|ansible_ssh_private_key_file)=.*\n", "",
                                cluster3.inventory.read_text(), flags=re.MULTILINE))
    assert "ansible_user" not in inventory.read_text()
    done = _driver("launch", "-i", inventory, "-u", "root", "--private-key", cluster3.key,
                   "--code-src", EXAMPLES, "--nproc-per-node", "1", "--runs-dir",
                   tmp_path / "runs", "--json", "--", "allreduce.py", cwd=REPO)
    result = json.loads(done.stdout)
    assert done.returncode == 0, (result.get("reason"), done.stderr[-2000:])
    assert {h["state"] for h in result["hosts"].values()} == {"succeeded"}


def test_a_limit_that_leaves_out_the_spare_launches_with_every_rank_kept(tmp_path):
    """-l as ansible-playbook's --limit: the embedded default's two nodes and a spare beside
    them, the spare left out by the limit. The job runs on the two with their ranks, and the
    spare is never touched (no task ran there: its root is never made). A status within a
    narrower limit leaves the run's record of the node it did not ask as it was."""
    spare_root = tmp_path / "node2-root"
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(re.sub(
        r"^(node1 .*)$", rf"\1\nnode2 ansible_host=127.0.0.3 torchherd_root={spare_root} "
                         r"torchherd_spare=true",
        LOCAL_INI.read_text().replace("{{ inventory_dir }}/../examples", str(EXAMPLES)),
        count=1, flags=re.MULTILINE))
    assert "node2" in inventory.read_text()
    run_id = f"limited-{uuid.uuid4().hex[:8]}"
    done = _driver("launch", "-i", inventory, "-l", "!node2", "--nproc-per-node", "1",
                   "--run-id", run_id, "--runs-dir", tmp_path / "runs", "--json", cwd=REPO)
    result = json.loads(done.stdout)
    assert done.returncode == 0, (result.get("reason"), done.stderr[-2000:])
    assert {h: (n["node_rank"], n["state"]) for h, n in result["hosts"].items()} == {
        "node0": (0, "succeeded"), "node1": (1, "succeeded")}
    plan = json.loads((tmp_path / "runs" / run_id / "plan.json").read_text())
    assert [n["host"] for n in plan["nodes"]] == ["node0", "node1"] and plan["spares"] == []
    assert plan["excluded"] == {"node2": "outside the limit all,!node2,localhost"}
    assert result["left_out"] == plan["excluded"]
    assert not spare_root.exists()
    # status within a narrower limit asks node0 alone: node1's last word stands, not unknown.
    done = _driver("status", run_id, "-l", "node0", "--runs-dir", tmp_path / "runs", "--json",
                   cwd=REPO)
    status = json.loads(done.stdout)
    assert done.returncode == 0, (status.get("reason"), done.stderr[-2000:])
    assert {h: n["state"] for h, n in status["hosts"].items()} == {
        "node0": "succeeded", "node1": "succeeded"}
    for root in NODE_ROOTS:
        shutil.rmtree(root / "runs" / run_id, ignore_errors=True)
