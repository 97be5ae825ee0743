"""Plain `ansible-playbook` on the embedded default (inventories/local.ini: two nodes on this
machine, no cluster): the usage `ansible-playbook playbooks/launch.yml -i cluster.ini` works
with the job in the inventory or given with -e, and Ansible prints no warning at all: no
deprecation (the watch runs on a built-in strategy; a collection's own strategy plugin is
deprecated in ansible-core 2.19 and warned about on every launch), and none of a template in a
task's `args` keyword (the facts call's and the start's computed arguments go in as their
modules' option `arguments`).
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
from tests.integration.helpers import EXAMPLES
from tests.integration.local_nodes import LOCAL_INI


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


def jobless_inventory(tmp_path: Path) -> Path:
    """local.ini's nodes without its job, as inventory/hosts.ini beside an empty group_vars/
    (where Ansible users put a group's settings)."""
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    hosts = [line for line in LOCAL_INI.read_text().splitlines()
             if not line.startswith("torchherd_job=")]
    (inventory / "hosts.ini").write_text("\n".join(hosts) + "\n")
    return inventory / "hosts.ini"


def job_in_group_vars(hosts: Path) -> None:
    """The node group's job in group_vars/torchherd_nodes.yml beside the inventory `hosts`."""
    (hosts.parent / "group_vars" / "torchherd_nodes.yml").write_text(json.dumps({"torchherd_job": {
        "script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 1,
        "name": "from-group-vars"}}))


def only_run(runs: Path) -> Path:
    # .interconnect holds the interconnect check's measures for reuse, not a run.
    found = [p for p in runs.iterdir() if not p.name.startswith(".")]
    assert len(found) == 1, found
    return found[0]


def test_launch_playbook_runs_without_warnings(tmp_path: Path) -> None:
    run_id = f"local-{uuid.uuid4().hex[:8]}"  # the nodes keep their run directories
    job = tmp_path / "job.yml"
    job.write_text(json.dumps({"torchherd_job": {
        "script": "allreduce.py", "code_src": str(EXAMPLES), "nproc_per_node": 1,
        "runs_dir": str(tmp_path / "runs"), "run_id": run_id}}))
    output = playbook("launch", LOCAL_INI, CHECKOUT, "-e", f"@{job}")
    assert "DEPRECATION" not in output.upper(), output[-3000:]
    assert [line for line in output.splitlines() if "[WARNING]" in line] == [], output[-3000:]
    summary = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())
    assert summary["state"] == "succeeded", summary
    # The local nodes have no firewall and the job asks for no interconnect check: those roles
    # end in their first (meta) task, so none of their tasks is even queued, not to skip it on
    # every node; no node holds rules, so the teardown has no task either. The gate passed:
    # preflight's verdict ends on the job's nodes after its table, so what only a launch that
    # ends in preflight (or a node left out) needs is not queued either.
    for role_task in ("Allow the job's traffic", "Remove the job's firewall rules",
                      "Measure the interconnect", "Send the launcher started ahead away",
                      "Stop before anything starts"):
        assert role_task not in output, output[-3000:]


def test_launch_playbook_runs_the_job_of_the_inventory(tmp_path: Path) -> None:
    # local.ini carries the demo job; nothing else is given, from a directory of its own.
    playbook("launch", LOCAL_INI, tmp_path)
    summary = json.loads((only_run(tmp_path / "runs") / "summary.json").read_text())
    assert summary["state"] == "succeeded", summary
    assert summary["nproc_per_node"] == 2 and summary["world_size"] == 4


def test_verify_takes_the_job_from_the_node_groups_group_vars(tmp_path: Path) -> None:
    # The plan runs on localhost, which is not in that group.
    hosts = jobless_inventory(tmp_path)
    job_in_group_vars(hosts)
    playbook("verify", hosts, tmp_path)
    run_dir = only_run(tmp_path / "runs")
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["job"]["name"] == "from-group-vars" and plan["nproc_per_node"] == 1
    assert json.loads((run_dir / "preflight.json").read_text())["gate"]["ok"]
    shutil.rmtree(run_dir)


def test_paths_with_a_tilde_are_the_users_home(tmp_path: Path) -> None:
    # As the driver reads them: ~ is the home directory, not a directory named ~.
    home = tmp_path / "home"
    (home / "src").mkdir(parents=True)
    shutil.copy(EXAMPLES / "allreduce.py", home / "src")
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
    hosts = jobless_inventory(tmp_path)
    playbook("verify", hosts, tmp_path)
    plan = json.loads((only_run(tmp_path / "runs") / "plan.json").read_text())
    assert plan["job"]["script"] == "" and plan["code_hash"] is None
    assert [n["host"] for n in plan["nodes"]] == ["node0", "node1"]
    assert _driver_verify(hosts, tmp_path / "jobless")["job"]["script"] == ""
    # A job in group_vars: the driver takes it, as ansible-playbook does.
    job_in_group_vars(hosts)
    plan = _driver_verify(hosts, tmp_path / "driver")
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


def _interconnect(runs: Path, run_id: str) -> dict:
    return json.loads((runs / run_id / "preflight.json").read_text())["gate"]["interconnect"]


def test_the_interconnect_measure_is_reused_only_for_the_same_nodes(tmp_path: Path) -> None:
    """Within its age a measure of the same nodes is reused; once a node is replaced (another
    host in its place, its own root) the nodes are measured again, and its torch probed."""
    from driver import verify

    def inventory(name: str, second: str, address: str) -> Path:
        path = tmp_path / f"{name}.ini"
        path.write_text(
            "[torchherd_nodes]\n"
            f"node0 ansible_host=127.0.0.1 torchherd_root={tmp_path}/node0\n"
            f"{second} ansible_host={address} torchherd_root={tmp_path}/{second}\n"
            "[torchherd_nodes:vars]\nansible_connection=local\n"
            "ansible_python_interpreter={{ ansible_playbook_python }}\n"
            "torchherd_firewall_enabled=false\n")
        return path

    runs = tmp_path / "runs"
    job = {"script": "allreduce.py", "code_src": str(EXAMPLES),
           "nproc_per_node": 1, "interconnect": "verify"}
    first = inventory("first", "node1", "127.0.0.2")
    for run_id in ("ic-first", "ic-again"):
        result = verify({**job, "run_id": run_id}, first, runs_dir=runs)
        assert result.ok, result.reason
    assert _interconnect(runs, "ic-first")["reused"] is None
    assert _interconnect(runs, "ic-again")["reused"]["run_id"] == "ic-first"
    replaced = inventory("replaced", "node2", "127.0.0.3")
    result = verify({**job, "run_id": "ic-replaced"}, replaced, runs_dir=runs)
    assert result.ok, result.reason
    measured = _interconnect(runs, "ic-replaced")
    assert measured["reused"] is None and measured["ok"], measured
    facts = json.loads((runs / "ic-replaced" / "preflight.json").read_text())["facts"]
    assert facts["node2"]["torch"]["cached"] is False
    assert facts["node0"]["torch"]["cached"] is True
