"""What the driver checks and says before and after Ansible: the inventory it hands to
ansible-playbook, and the failure message it reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from driver import arguments, cli
from driver.inputs import inventory_source
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
    from driver.outcomes import first_message
    from driver.runner import Outcome

    own = "torchherd plan: the job cannot start:\n  - job.nproc_per_node: expected a positive"
    wrapped = ("Task failed: Finalization of task args for 'ansible.builtin.set_fact' failed: "
               "Error while resolving value for 'torchherd_plan': The filter plugin "
               "'torchherd.cluster.plan' failed: " + own)
    failure = {"event": "runner_on_failed",
               "event_data": {"host": "localhost", "res": {"msg": wrapped}}}
    assert first_message(Outcome(status="failed", rc=2, failures=[failure])) == own
    node = {"event": "runner_on_failed",
            "event_data": {"host": "n1", "res": {"msg": "Task failed."}}}
    assert first_message(Outcome(status="failed", rc=2, failures=[node])) == "n1: Task failed."


LOCAL = str(Path(__file__).resolve().parents[2] / "inventories" / "local.ini")


@pytest.mark.parametrize("start", ["launch_async", "verify_async"])
def test_a_missing_code_directory_is_raised_before_anything_runs(tmp_path, monkeypatch, start):
    from driver import api
    from driver.spec import JobSpecError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    for code_src, found in (("nope", "no such directory"), ("train.py", "a file")):
        with pytest.raises(JobSpecError, match=f"job key 'code_src': expected a directory on "
                                               f"this machine .*, found {found}: {code_src} "):
            getattr(api, start)({"script": "train.py", "code_src": code_src}, LOCAL)
    assert not (tmp_path / "runs").exists()


def test_the_cli_maps_a_missing_code_directory_to_the_usage_exit(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = cli.main(["launch", "-i", LOCAL, "--code-src", "nope", "--json", "--", "t.py"])
    assert code == Exit.USAGE
    doc = json.loads(capsys.readouterr().out)
    assert (doc["state"], doc["exit_name"]) == ("invalid", "usage")
    assert "job key 'code_src'" in doc["reason"] and "nope" in doc["reason"]
    assert not (tmp_path / "runs").exists()


def test_what_the_plan_refuses_is_raised_not_returned(tmp_path):
    """A run the plan refused (no plan.json) is bad input: wait() raises it, as the driver's own
    checks do; a planned run's failure is a result."""
    from driver.outcomes import result_of
    from driver.runner import Outcome

    refusal = {"event": "runner_on_failed", "event_data": {"host": "localhost", "res": {
        "msg": "torchherd plan: the job cannot start:\n  - node_group: expected gpus"}}}
    outcome = Outcome(status="failed", rc=2, failures=[refusal])
    with pytest.raises(UsageError, match="node_group: expected gpus"):
        result_of(tmp_path / "run", "launch", outcome)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "plan.json").write_text("{}")
    result = result_of(tmp_path / "run", "launch", outcome)
    assert result.exit_code == Exit.ERROR and "node_group: expected gpus" in result.reason


def _inventory_with_a_job(tmp_path: Path) -> Path:
    """An inventory directory as Ansible users write one: the job in the node group's
    group_vars, with a template of Ansible's own (inventory_dir)."""
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.ini").write_text("[torchherd_nodes]\nn0 ansible_host=192.0.2.1\n"
                                         "n1 ansible_host=192.0.2.2\n")
    (inventory / "group_vars" / "torchherd_nodes.yml").write_text(
        "torchherd_job:\n  script: train.py\n  code_src: '{{ inventory_dir }}/code'\n"
        "  nproc_per_node: 4\n  env: {A: '1', B: '2'}\n  master_port: 29600\n")
    (inventory / "code").mkdir()
    return inventory / "hosts.ini"


def test_the_inventorys_job_is_read_as_ansible_reads_it(tmp_path):
    from driver.inputs import inventory_job

    inventory = _inventory_with_a_job(tmp_path)
    host, job = inventory_job(str(inventory))
    assert host == "n0" and job["code_src"] == f"{inventory.parent}/code"
    assert job["nproc_per_node"] == 4 and type(job["env"]) is dict
    assert inventory_job("192.0.2.7,192.0.2.8,") == ("", {})


def test_flags_over_the_job_file_over_the_inventory_over_the_defaults(tmp_path, monkeypatch):
    from driver.inputs import prepare_job

    monkeypatch.chdir(tmp_path)
    inventory = str(_inventory_with_a_job(tmp_path))
    (tmp_path / "job.yml").write_text("master_port: 29700\ntimeout: 60\n")
    args = arguments.build_parser().parse_args(["verify", "-i", inventory, "-j", "job.yml",
                                          "--master-port", "29800", "-e", "B=3"])
    job = prepare_job(arguments.job_from(args), None, inventory, "verify")
    assert job["master_port"] == 29800 and job["timeout"] == 60  # flag, file
    assert job["script"] == "train.py" and job["nproc_per_node"] == 4  # inventory
    assert job["env"] == {"A": "1", "B": "3"}  # -e adds to the inventory's env
    assert job["backend"] == "auto"  # default


def test_a_bad_value_in_the_inventorys_job_names_the_inventory_and_host(tmp_path):
    from driver.inputs import prepare_job

    inventory = _inventory_with_a_job(tmp_path)
    (inventory.parent / "group_vars" / "torchherd_nodes.yml").write_text(
        "torchherd_job: {script: t.py, nproc_per_nod: 2}\n")
    with pytest.raises(UsageError, match=f"inventory {inventory}: torchherd_job of host n0: "
                                         f"expected a job torchherd can run"):
        prepare_job({}, str(tmp_path / "runs"), str(inventory), "verify")


def test_launch_needs_a_script_verify_does_not(tmp_path, monkeypatch):
    from driver.inputs import prepare_job

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="job key 'script': required"):
        prepare_job({}, None, "192.0.2.7,", "launch")
    assert prepare_job({}, None, "192.0.2.7,", "verify")["script"] == ""
    assert cli.main(["launch", "-i", "192.0.2.7,"]) == Exit.USAGE


def test_a_vaulted_inventory_job_is_read_with_the_callers_vault_password(tmp_path):
    import subprocess
    import sys

    inventory = _inventory_with_a_job(tmp_path)
    password = tmp_path / "vault-pass"
    password.write_text("pw\n")
    vaulted = inventory.parent / "group_vars" / "torchherd_nodes.yml"
    subprocess.run([str(Path(sys.executable).parent / "ansible-vault"), "encrypt",
                    "--vault-password-file", str(password), str(vaulted)],
                   check=True, capture_output=True)
    assert "$ANSIBLE_VAULT" in vaulted.read_text()
    # A process of its own: Ansible reads its configuration (here the environment) once.
    read = ("import sys; from driver.inputs import inventory_job; "
            "print(inventory_job(sys.argv[1])[1]['nproc_per_node'])")
    root = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "ANSIBLE_VAULT_PASSWORD_FILE": str(password)}
    done = subprocess.run([sys.executable, "-c", read, str(inventory)], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    assert done.stdout.strip() == "4", done.stderr
    del env["ANSIBLE_VAULT_PASSWORD_FILE"]
    done = subprocess.run([sys.executable, "-c", read, str(inventory)], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    assert "JobSpecError" in done.stderr and "vault_password_file in ansible.cfg" in done.stderr


def test_an_inventory_plugins_configuration_is_left_to_ansible_playbook(tmp_path, monkeypatch):
    """The SLURM allocation's inventory (torchherd.cluster.slurm): the driver does not load a
    collection's inventory plugin, so it takes no job from it and says nothing; with unparsed
    sources made fatal (the sbatch script does so) it must not refuse the launch either."""
    from driver.inputs import inventory_job

    source = tmp_path / "cluster.slurm.yml"
    source.write_text("plugin: torchherd.cluster.slurm\n")
    monkeypatch.setenv("ANSIBLE_INVENTORY_UNPARSED_FAILED", "true")
    assert inventory_job(str(source)) == ("", {})


def test_an_inventory_that_names_no_job_is_not_read_through_ansibles_inventory(tmp_path,
                                                                              monkeypatch):
    """Reading an inventory through Ansible costs every launch ~0.25 s before ansible-playbook
    starts: the driver does it only where a file Ansible reads for the source's variables names
    the job (or is vaulted, or is a script), or a vars plugin of the configuration could."""
    import subprocess
    import sys

    from ansible import constants

    from driver.inputs import _may_hold_a_job

    # Ansible's defaults, whatever this machine's configuration holds (a vars plugin in
    # ~/.ansible/plugins/vars would read every inventory, rightly).
    monkeypatch.setattr(constants, "VARIABLE_PLUGINS_ENABLED", ["host_group_vars"])
    monkeypatch.setattr(constants, "DEFAULT_VARS_PLUGIN_PATH", [str(tmp_path / "no-plugins")])

    inventory = _inventory_with_a_job(tmp_path)
    assert _may_hold_a_job(str(inventory)) and _may_hold_a_job(str(inventory.parent))
    (inventory.parent / "group_vars" / "torchherd_nodes.yml").write_text("ansible_user: u\n")
    assert not _may_hold_a_job(str(inventory)) and not _may_hold_a_job(str(inventory.parent))
    (inventory.parent / "host_vars").mkdir()
    (inventory.parent / "host_vars" / "localhost.yml").write_text("torchherd_job: {}\n")
    assert _may_hold_a_job(str(inventory))
    (inventory.parent / "host_vars" / "localhost.yml").unlink()
    inventory.write_text(inventory.read_text() + "[all:vars]\ntorchherd_job={'script': 'a.py'}\n")
    assert _may_hold_a_job(str(inventory))
    assert not _may_hold_a_job("192.0.2.7,192.0.2.8,")
    script = tmp_path / "inventory.sh"
    script.write_text("#!/bin/sh\necho '{}'\n")
    script.chmod(0o755)
    assert _may_hold_a_job(str(script))
    # A script among a directory's sources runs (its output may hold a job); a file of
    # group_vars is only read.
    inventory.write_text("[torchherd_nodes]\nn0 ansible_host=192.0.2.1\n")
    assert not _may_hold_a_job(str(inventory.parent))
    (inventory.parent / "group_vars" / "torchherd_nodes.yml").chmod(0o755)
    assert not _may_hold_a_job(str(inventory.parent))
    script.rename(inventory.parent / "dynamic.sh")
    assert _may_hold_a_job(str(inventory.parent))

    plain = tmp_path / "plain.ini"
    plain.write_text("[torchherd_nodes]\nn0 ansible_host=192.0.2.1\n")
    read = ("import sys; from driver.inputs import inventory_job, _may_hold_a_job; "
            "print(inventory_job(sys.argv[1]), _may_hold_a_job(sys.argv[1]), "
            "'ansible.inventory.manager' in sys.modules)")
    root = Path(__file__).resolve().parents[2]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "ANSIBLE_VARS_PLUGINS": str(tmp_path / "no-plugins")}
    done = subprocess.run([sys.executable, "-c", read, str(plain)], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    assert done.stdout.split() == ["('',", "{})", "False", "False"], done.stderr
    # A vars plugin enabled in the configuration could give a job: the inventory is read.
    env["ANSIBLE_VARS_ENABLED"] = "host_group_vars,example.site.vars"
    done = subprocess.run([sys.executable, "-c", read, str(plain)], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    assert done.stdout.split()[-2:] == ["True", "True"], done.stderr
    # So could a vars plugin of the old kind, on a vars plugin path (they run unasked).
    del env["ANSIBLE_VARS_ENABLED"]
    (tmp_path / "no-plugins").mkdir()
    (tmp_path / "no-plugins" / "site_vars.py").write_text("")
    done = subprocess.run([sys.executable, "-c", read, str(plain)], cwd=root, env=env,
                          capture_output=True, text=True, check=False)
    assert done.stdout.split()[-2:] == ["True", "True"], done.stderr
