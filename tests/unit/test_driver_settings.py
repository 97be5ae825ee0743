"""What the driver sets for a run, and what it leaves to the caller's Ansible configuration."""

from __future__ import annotations

import os
import tomllib

import yaml

from driver import paths
from driver.runner import (
    OWN_CONFIG,
    OWN_FORKS,
    OWN_SSH_ARGS,
    RUN_SETTINGS,
    SSH_EXTRA_ARGS,
    _cmdline,
    all_at_once,
    run_settings,
)

COLLECTION = paths.CHECKOUT / "collection" / "ansible_collections" / "torchherd" / "cluster"


def test_versions_agree():
    """The plan refuses a collection whose version is not the driver's: one version, VERSION's,
    which the wheel reads and scripts/set-version.py writes into galaxy.yml and the plan."""
    version = (paths.CHECKOUT / "VERSION").read_text().strip()
    galaxy = yaml.safe_load((COLLECTION / "galaxy.yml").read_text())["version"]
    plan = yaml.safe_load((COLLECTION / "roles/plan/vars/main.yml").read_text())
    pyproject = tomllib.loads((paths.CHECKOUT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"], "the wheel's version is VERSION's, not its own"
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"file": "VERSION"}
    assert str(galaxy) == str(plan["torchherd_collection_version"]) == version, (
        "run scripts/set-version.py VERSION")
    # The changelog's newest release is this version (antsibull-changelog release, see
    # docs/ansible.md), and every plugin its releases name as new is still there.
    changes = yaml.safe_load((COLLECTION / "changelogs/changelog.yaml").read_text())
    releases = sorted(changes["releases"], key=lambda v: tuple(map(int, v.split("."))))
    assert releases[-1] == version, "release the changelog: antsibull-changelog release"
    listed = changes["releases"][version]
    for entry in listed.get("modules") or []:
        assert (COLLECTION / "plugins" / "modules" / f"{entry['name']}.py").is_file(), entry
    for kind, entries in (listed.get("plugins") or {}).items():
        # A file of filters names each of its filters.
        texts = [p.read_text() for p in (COLLECTION / "plugins" / kind).glob("*.py")]
        for entry in entries:
            assert any(f"{entry['name']}" in t for t in texts), entry


def without_ansible_configuration(tmp_path, monkeypatch, *variables):
    """A caller in tmp_path with no Ansible configuration of their own (no ANSIBLE_CONFIG, no
    ansible.cfg there or in HOME) and none of ``variables`` set; False where this machine has
    /etc/ansible/ansible.cfg, which would be the caller's."""
    monkeypatch.chdir(tmp_path)
    for name in ("ANSIBLE_CONFIG", *variables):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return not os.path.exists("/etc/ansible/ansible.cfg")


def test_the_callers_environment_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = run_settings({"PATH": "/bin", "ANSIBLE_PIPELINING": "False",
                        "ANSIBLE_HOST_KEY_CHECKING": "False"})
    assert "ANSIBLE_PIPELINING" not in env  # the caller's own value stays
    assert "ANSIBLE_HOST_KEY_CHECKING" not in env
    assert env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] == RUN_SETTINGS[
        "ANSIBLE_INVENTORY_UNPARSED_FAILED"]
    assert env["PATH"].endswith(os.pathsep + "/bin")


def test_a_caller_without_ansible_configuration_gets_the_drivers(tmp_path, monkeypatch):
    """internal_poll_interval has no environment variable: a configuration file sets it."""
    from ansible.config.manager import ConfigManager
    if not without_ansible_configuration(tmp_path, monkeypatch):
        return  # this machine's own configuration is the caller's
    own = run_settings({"PATH": ""})["ANSIBLE_CONFIG"]
    assert own == str(OWN_CONFIG)
    monkeypatch.setenv("ANSIBLE_CONFIG", own)
    assert ConfigManager().get_config_value("DEFAULT_INTERNAL_POLL_INTERVAL") == 0.02
    # A caller's own ansible.cfg, or ANSIBLE_CONFIG, is theirs.
    monkeypatch.delenv("ANSIBLE_CONFIG")
    (tmp_path / "ansible.cfg").write_text("[defaults]\nforks = 7\n")
    assert "ANSIBLE_CONFIG" not in run_settings({"PATH": ""})
    assert "ANSIBLE_CONFIG" not in run_settings({"PATH": "", "ANSIBLE_CONFIG": "/x.cfg"})


def test_host_key_checking_follows_the_callers_ansible_cfg(tmp_path, monkeypatch):
    """ansible-runner would turn checking off; the driver passes the caller's own setting."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ANSIBLE_CONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert run_settings({"PATH": ""})["ANSIBLE_HOST_KEY_CHECKING"] == "True"
    (tmp_path / "ansible.cfg").write_text("[defaults]\nhost_key_checking = False\n")
    assert run_settings({"PATH": ""})["ANSIBLE_HOST_KEY_CHECKING"] == "False"


def test_one_worker_per_node_up_to_a_bound_unless_the_caller_sets_forks(tmp_path, monkeypatch):
    """Ansible's default of 5 forks runs 32 nodes in seven waves of every task: where the
    caller's configuration sets no forks, a run gets OWN_FORKS (ansible-core starts no more
    workers than a play has hosts); a caller's forks, in a file or the environment, hold."""
    if not without_ansible_configuration(tmp_path, monkeypatch, "ANSIBLE_FORKS"):
        return  # this machine's own configuration is the caller's
    assert run_settings({"PATH": ""})["ANSIBLE_FORKS"] == str(OWN_FORKS) == "64"
    (tmp_path / "ansible.cfg").write_text("[defaults]\nhost_key_checking = False\n")
    assert run_settings({"PATH": ""})["ANSIBLE_FORKS"] == "64"  # a file that sets no forks
    (tmp_path / "ansible.cfg").write_text("[defaults]\nforks = 7\n")
    assert "ANSIBLE_FORKS" not in run_settings({"PATH": ""})
    (tmp_path / "ansible.cfg").unlink()
    monkeypatch.setenv("ANSIBLE_FORKS", "3")
    assert "ANSIBLE_FORKS" not in run_settings({"PATH": "", "ANSIBLE_FORKS": "3"})


def test_collections_path_order(tmp_path, monkeypatch):
    override = tmp_path / "mine"
    env = paths.collections_env({"TORCHHERD_COLLECTIONS_PATH": str(override),
                                 "ANSIBLE_COLLECTIONS_PATH": "/opt/c"})
    assert env["ANSIBLE_COLLECTIONS_PATH"] == f"{override}{os.pathsep}/opt/c"
    # A checkout's copy comes after what Ansible is configured with.
    env = paths.collections_env({"ANSIBLE_COLLECTIONS_PATH": "/opt/c"})
    assert env["ANSIBLE_COLLECTIONS_PATH"] == f"/opt/c{os.pathsep}{paths.CHECKOUT / 'collection'}"
    monkeypatch.setattr(paths, "is_checkout", lambda: False)
    assert paths.collections_env({"ANSIBLE_COLLECTIONS_PATH": "/opt/c"}) == {}


def test_ssh_and_forks_on_the_command_line(monkeypatch):
    monkeypatch.delenv("ANSIBLE_FORKS", raising=False)
    argv = _cmdline(all_at_once("verify", {}))
    assert argv[:2] == ["--forks", "1024"]
    # One argument: a value that starts with '-' would be read as an option.
    assert argv[2] == "--ssh-extra-args=" + " ".join(SSH_EXTRA_ARGS)
    assert "BatchMode=yes" in argv[2]
    monkeypatch.setenv("ANSIBLE_FORKS", "2048")
    assert _cmdline(True)[1] == "2048"


def test_a_launch_takes_the_callers_forks_unless_it_measures_the_interconnect():
    assert _cmdline(all_at_once("launch", {"torchherd_job": {"script": "t.py"}})) == [
        "--ssh-extra-args=" + " ".join(SSH_EXTRA_ARGS)]
    assert all_at_once("launch", {"torchherd_job": {"interconnect": "always"}})
    assert all_at_once("launch", {"torchherd_job": {"hang_timeout": 60}})
    assert not all_at_once("stop", {})


def test_connections_are_kept_for_a_relaunch_unless_the_caller_sets_ssh_args(tmp_path,
                                                                             monkeypatch):
    """Where the caller's configuration sets no ssh_args, a run keeps each node's connection
    for ten minutes (Ansible's own 60 s would make a relaunch a few minutes later pay every
    handshake again); a caller's ssh_args, in a file or the environment, hold."""
    if not without_ansible_configuration(tmp_path, monkeypatch, "ANSIBLE_SSH_ARGS"):
        return  # this machine's own configuration is the caller's
    assert run_settings({"PATH": ""})["ANSIBLE_SSH_ARGS"] == OWN_SSH_ARGS
    assert "ControlPersist=10m" in OWN_SSH_ARGS and "ControlMaster=auto" in OWN_SSH_ARGS
    (tmp_path / "ansible.cfg").write_text("[ssh_connection]\npipelining = True\n")
    assert run_settings({"PATH": ""})["ANSIBLE_SSH_ARGS"] == OWN_SSH_ARGS
    (tmp_path / "ansible.cfg").write_text("[ssh_connection]\nssh_args = -o ControlMaster=no\n")
    assert "ANSIBLE_SSH_ARGS" not in run_settings({"PATH": ""})
    (tmp_path / "ansible.cfg").unlink()
    assert "ANSIBLE_SSH_ARGS" not in run_settings({"PATH": "", "ANSIBLE_SSH_ARGS": "-4"})
