"""torchherd as a user gets it: the built wheel in a fresh venv, used from a directory that is
not the checkout, with nothing of the checkout on any path."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from driver.paths import CHECKOUT
from tests.integration.helpers import EXAMPLES, made_once

pytestmark = pytest.mark.cluster


def _run(argv, cwd, env, timeout=600):
    result = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                            text=True, timeout=timeout, check=False)
    return result


def _clean_env(venv: Path) -> dict[str, str]:
    """The environment of a new shell with only the venv activated: no checkout on any path,
    none of the suite's Ansible settings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANSIBLE_", "TORCHHERD_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    return env


@pytest.fixture(scope="module")
def installed(wheel, suite_shared, tmp_path_factory):
    """(venv, workdir): the wheel built from this checkout, installed into a fresh venv. The
    venv is made once for the suite run (the module's tests in both their xdist groups use it;
    none writes into it), the workdir is the module's own."""

    def install(venv: Path) -> None:
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        # Dependencies from the package index (pip's cache makes this quick after setup.sh).
        pip = _run([venv / "bin" / "pip", "install", "-q", wheel], cwd=venv,
                   env=_clean_env(venv))
        assert pip.returncode == 0, pip.stderr[-3000:]
        print(f"wheel installed in {time.monotonic() - started:.1f} s", file=sys.stderr)

    venv = made_once(suite_shared, f"venv-{wheel.parents[1].name}", install)
    work = tmp_path_factory.mktemp("install") / "work"
    work.mkdir()
    shutil.copytree(EXAMPLES, work / "code")
    return venv, work


def _torchherd(installed, *args, timeout=600):
    venv, work = installed
    return _run([venv / "bin" / "torchherd", *args], cwd=work, env=_clean_env(venv),
                timeout=timeout)


def test_the_installed_driver_carries_its_collection(installed):
    venv, work = installed
    version = _torchherd(installed, "--version")
    assert version.returncode == 0, version.stderr
    project = yaml.safe_load((CHECKOUT / "collection/ansible_collections/torchherd/cluster"
                              / "galaxy.yml").read_text())
    assert version.stdout.strip() == f"torchherd {project['version']}"
    where = _run([venv / "bin" / "python", "-c",
                  "import driver, driver.paths as p; print(driver.__file__); "
                  "print(p.collection_dir())"], cwd=work, env=_clean_env(venv))
    module, collection = where.stdout.split()
    assert module.startswith(str(venv)) and collection.startswith(str(venv)), where.stdout
    assert (Path(collection) / "roles" / "plan" / "meta" / "argument_specs.yml").is_file()
    helped = _torchherd(installed, "launch", "--help")
    assert helped.returncode == 0 and "--nproc-per-node" in helped.stdout, helped.stderr


def test_installed_launch_on_local_nodes(installed, tmp_path):
    """The embedded default's kind of nodes: this machine, with the suite's Python (which has
    torch) as the nodes' Python; the venv itself has no torch."""
    venv, work = installed
    inventory = tmp_path / "local.ini"
    inventory.write_text(
        "[torchherd_nodes]\n"
        f"node0 ansible_host=127.0.0.1 torchherd_root={tmp_path / 'node0'}\n"
        f"node1 ansible_host=127.0.0.2 torchherd_root={tmp_path / 'node1'}\n"
        "[torchherd_nodes:vars]\nansible_connection=local\n"
        f"ansible_python_interpreter={sys.executable}\ntorchherd_firewall_enabled=false\n")
    done = _torchherd(installed, "launch", "--json", "-i", inventory, "--code-src", "code",
                      "--nproc-per-node", "2", "--", "allreduce.py")
    result = json.loads(done.stdout)
    assert done.returncode == 0, (result.get("reason"), done.stderr[-2000:])
    assert result["exit_name"] == "ok"
    assert Path(result["run_dir"]).parent == work / "runs"
    assert {h["state"] for h in result["hosts"].values()} == {"succeeded"}


def test_installed_launch_on_the_container_cluster(installed, cluster3):
    done = _torchherd(installed, "launch", "--json", "-i", cluster3.inventory, "--code-src",
                      "code", "--nproc-per-node", "1", "--", "allreduce.py")
    result = json.loads(done.stdout)
    assert done.returncode == 0, (result.get("reason"), done.stderr[-2000:])
    assert sorted(result["hosts"]) == sorted(n.name for n in cluster3.nodes)
    # Every node's log came back with its rank's result in it. (Not its last line: torchrun's
    # agents may log a failed exit barrier after a good run, when the master's agent, which
    # holds the store, leaves first.)
    for name, h in result["hosts"].items():
        assert h["state"] == "succeeded" and h["logs_fetched"], (name, h)
        assert "sum=" in Path(h["log"]).read_text(), (name, h["last_line"])


def test_a_collection_on_ansibles_path_comes_first_and_must_match(installed, tmp_path):
    """One installed with ansible-galaxy (here: a copy on ANSIBLE_COLLECTIONS_PATH) is the one
    Ansible uses, before the wheel's own; of another version, the plan refuses it by path."""
    venv, work = installed
    other = tmp_path / "galaxy" / "ansible_collections" / "torchherd" / "cluster"
    shutil.copytree(CHECKOUT / "collection/ansible_collections/torchherd/cluster", other,
                    ignore=shutil.ignore_patterns("tests", "__pycache__"))
    version_vars = other / "roles" / "plan" / "vars" / "main.yml"
    version_vars.write_text("---\ntorchherd_collection_version: 0.0.1\n")
    env = {**_clean_env(venv), "ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "galaxy")}
    done = _run([venv / "bin" / "torchherd", "verify", "--json", "-i", "node0,",
                 "--code-src", "code", "--", "allreduce.py"], cwd=work, env=env)
    result = json.loads(done.stdout)
    assert done.returncode != 0
    ours = yaml.safe_load((CHECKOUT / "collection/ansible_collections/torchherd/cluster"
                           / "galaxy.yml").read_text())["version"]
    assert f"expected version {ours}" in result["reason"], result["reason"]
    assert "found 0.0.1" in result["reason"]
    assert str(other) in result["reason"], result["reason"]


def _section(title: str) -> str:
    text = (CHECKOUT / "README.md").read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readmes_real_cluster_commands_run_as_written(installed, cluster3, tmp_path):
    """README's "Point it at a real cluster", from the wheel in a fresh venv, in a project of
    the user's: its inventory a copy of the cluster's, its code ~/src/myproject. The only
    change: the job Python of the README's example venv is the nodes' own (which has torch)."""
    venv, _ = installed
    section = _section("Point it at a real cluster")
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)
    shell = [body for lang, body in blocks if not lang]
    job_yaml = next(body for lang, body in blocks if lang == "yaml")
    verify = re.search(r"`(torchherd verify [^`]*)`", section).group(1)
    node_python = "/usr/bin/python3"

    def as_here(command: str) -> str:
        return command.replace("/opt/venvs/train/bin/python", node_python)

    # A home of a usual length: Ansible's SSH control sockets go in ~/.ansible/cp, and a
    # socket's path has at most 107 bytes.
    home, work = Path(tempfile.mkdtemp(prefix="th-home-", dir="/tmp")), tmp_path / "project"
    (home / "src" / "myproject").mkdir(parents=True)
    shutil.copy(EXAMPLES / "train_ddp.py", home / "src" / "myproject" / "train.py")
    (work / "inventories").mkdir(parents=True)
    shutil.copy(cluster3.inventory, work / "inventories" / "my-cluster.ini")
    (work / "job.yml").write_text(as_here(job_yaml))
    env = {**_clean_env(venv), "HOME": str(home), "WANDB_API_KEY": "unused"}

    def run(command: str) -> subprocess.CompletedProcess[str]:
        done = _run(["bash", "-c", command], cwd=work, env=env)
        assert done.returncode == 0, (command, (done.stdout + done.stderr)[-3000:])
        return done

    run(as_here(verify))
    for command in shell[:2]:  # the launch: torchherd, then ansible-playbook alone
        run(as_here(command))
    runs = json.loads(run("torchherd runs --json").stdout)["runs"]
    # verify's, then both launches' (oldest first).
    assert [r["state"] for r in runs] == ["verified", "succeeded", "succeeded"], runs
    run_id = runs[1]["run_id"]
    for line in shell[2].splitlines():  # after a launch
        command = line.split("  #")[0].strip().replace("RUN_ID", run_id)
        command = command.replace("-i INV", "-i inventories/my-cluster.ini")
        done = run(command)
        if command.startswith("torchherd stacks"):  # of an ended job: its state, no stack
            assert f"run {run_id} succeeded" in done.stderr, done.stderr
    subprocess.run(["pkill", "-f", f"ssh: {home}/"], check=False)  # its SSH masters
    shutil.rmtree(home, ignore_errors=True)
