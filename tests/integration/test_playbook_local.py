"""Plain `ansible-playbook` on the embedded default (inventories/local.ini: two nodes on this
machine, no cluster): the usage `ansible-playbook playbooks/launch.yml -i cluster.ini` works
with the job in the inventory or given with -e, and Ansible prints no deprecation warning (the
watch runs on a built-in strategy; a collection's own strategy plugin is deprecated in
ansible-core 2.19 and warned about on every launch).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from driver.paths import CHECKOUT

LOCAL_INI = CHECKOUT / "inventories" / "local.ini"


def playbook(name: str, inventory: Path, cwd: Path, *extra: str, home: Path | None = None) -> str:
    """Run playbooks/<name>.yml from `cwd` with the checkout's ansible.cfg; its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(CHECKOUT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    if home:
        env["HOME"] = str(home)
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"),
         str(CHECKOUT / "playbooks" / f"{name}.yml"), "-i", str(inventory), *extra],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    return output


def only_run(runs: Path) -> Path:
    # .interconnect holds the interconnect check's measures for reuse, not a run.
    found = [p for p in runs.iterdir() if not p.name.startswith(".")]
    assert len(found) == 1, found
    return found[0]


def test_launch_playbook_runs_without_deprecation_warnings(tmp_path: Path) -> None:
    run_id = f"local-{uuid.uuid4().hex[:8]}"  # the nodes keep their run directories
    job = tmp_path / "job.yml"
    job.write_text(json.dumps({"torchherd_job": {
        "script": "allreduce.py", "code_src": str(CHECKOUT / "examples"), "nproc_per_node": 1,
        "runs_dir": str(tmp_path / "runs"), "run_id": run_id}}))
    output = playbook("launch", LOCAL_INI, CHECKOUT, "-e", f"@{job}")
    assert "DEPRECATION" not in output.upper(), output[-3000:]
    summary = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())
    assert summary["state"] == "succeeded", summary


def test_launch_playbook_runs_the_job_of_the_inventory(tmp_path: Path) -> None:
    # local.ini carries the demo job; nothing else is given, from a directory of its own.
    playbook("launch", LOCAL_INI, tmp_path)
    summary = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())
    assert summary["state"] == "succeeded", summary
    assert summary["nproc_per_node"] == 2 and summary["world_size"] == 4


def test_verify_takes_the_job_from_the_node_groups_group_vars(tmp_path: Path) -> None:
    # Where Ansible users put a group's settings: group_vars/<group>.yml beside the inventory.
    # The plan runs on localhost, which is not in that group.
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    hosts = [line for line in LOCAL_INI.read_text().splitlines()
             if not line.startswith("torchherd_job=")]
    (inventory / "hosts.ini").write_text("\n".join(hosts) + "\n")
    (inventory / "group_vars" / "torchherd_nodes.yml").write_text(json.dumps({"torchherd_job": {
        "script": "allreduce.py", "code_src": str(CHECKOUT / "examples"), "nproc_per_node": 1,
        "name": "from-group-vars"}}))
    playbook("verify", inventory / "hosts.ini", tmp_path)
    run_dir = only_run(tmp_path / "runs")
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["job"]["name"] == "from-group-vars" and plan["nproc_per_node"] == 1
    assert json.loads((run_dir / "preflight.json").read_text())["gate"]["ok"]
    shutil.rmtree(run_dir)


def test_paths_with_a_tilde_are_the_users_home(tmp_path: Path) -> None:
    # As the driver reads them: ~ is the home directory, not a directory named ~.
    home = tmp_path / "home"
    (home / "src").mkdir(parents=True)
    shutil.copy(CHECKOUT / "examples" / "allreduce.py", home / "src")
    job = tmp_path / "job.yml"
    job.write_text(json.dumps({"torchherd_job": {
        "script": "allreduce.py", "code_src": "~/src", "runs_dir": "~/runs",
        "nproc_per_node": 1}}))
    playbook("verify", LOCAL_INI, tmp_path, "-e", f"@{job}", home=home)
    plan = json.loads((only_run(home / "runs") / "plan.json").read_text())
    assert plan["job"]["code_src"] == str(home / "src")
    assert not (tmp_path / "~").exists()


def _driver_verify(inventory: Path, runs: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "driver", "verify", "-i", str(inventory), "--runs-dir", str(runs),
         "--json"], cwd=runs.parent, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return json.loads((only_run(runs) / "plan.json").read_text())


def test_both_entry_points_verify_without_a_job_and_take_the_inventorys(tmp_path: Path) -> None:
    # No job anywhere: verify checks the nodes alone, on both entry points.
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    hosts = [line for line in LOCAL_INI.read_text().splitlines()
             if not line.startswith("torchherd_job=")]
    (inventory / "hosts.ini").write_text("\n".join(hosts) + "\n")
    playbook("verify", inventory / "hosts.ini", tmp_path)
    plan = json.loads((only_run(tmp_path / "runs") / "plan.json").read_text())
    assert plan["job"]["script"] == "" and plan["code_hash"] is None
    assert [n["host"] for n in plan["nodes"]] == ["node0", "node1"]
    assert _driver_verify(inventory / "hosts.ini", tmp_path / "jobless")["job"]["script"] == ""
    # A job in group_vars: the driver takes it, as ansible-playbook does.
    (inventory / "group_vars" / "torchherd_nodes.yml").write_text(json.dumps({"torchherd_job": {
        "script": "allreduce.py", "code_src": str(CHECKOUT / "examples"), "nproc_per_node": 1,
        "name": "from-group-vars"}}))
    plan = _driver_verify(inventory / "hosts.ini", tmp_path / "driver")
    assert plan["job"]["name"] == "from-group-vars" and plan["nproc_per_node"] == 1
    assert plan["code_files"] > 0


def test_an_inline_host_list_is_a_list_of_hosts(tmp_path: Path) -> None:
    # -i 'a,b,' as ansible-playbook reads it: two hosts (not one INI host named "a,b,"). The
    # names resolve nowhere, so verify stops at SSH, having named both.
    proc = subprocess.run(
        [sys.executable, "-m", "driver", "verify", "-i", "th-a.invalid,th-b.invalid,",
         "--node-group", "all", "--runs-dir", str(tmp_path / "runs"), "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    doc = json.loads(proc.stdout)
    assert doc["exit_name"] == "node_unreachable", proc.stderr[-3000:]
    assert sorted(doc["hosts"]) == ["th-a.invalid", "th-b.invalid"]
