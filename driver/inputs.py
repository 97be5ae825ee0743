"""What a call of the API takes, checked before any node is touched: the job (the caller's
keys over the inventory's torchherd_job), the inventory source, and the run id of a past run.
Bad input raises UsageError (JobSpecError for the job's keys)."""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

import yaml

from driver.ansible_options import vault_secrets
from driver.result import DRIVER_FILE, UsageError, read_json
from driver.spec import JobSpecError, raw_problems, validate

DEFAULT_RUNS_DIR = "runs"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def prepare_job(job: dict[str, Any], runs_dir: str | Path | None, source: str,
             action: str) -> dict[str, Any]:
    """The job to run: the caller's keys over the inventory's job (inventory_job), checked,
    with defaults; the run id, runs_dir and code_src made definite."""
    host, base = inventory_job(source)
    if base:
        where = f"inventory {source}: torchherd_job of host {host}"
        validate(base, where)
        problems = raw_problems(base)
        if problems:
            raise JobSpecError(f"{where}: {'; '.join(problems)}; fix: correct it in the "
                               f"inventory")
    # The caller's env, secret_env and rdzv_conf add to the inventory's, as -e adds to a job
    # file's env.
    job = validate({**base, **job, **{k: {**base[k], **job[k]} for k in job.keys() & base.keys()
                                      if isinstance(base[k], dict) and isinstance(job[k], dict)}})
    if action == "launch" and not job["script"]:
        raise JobSpecError("job key 'script': required (str); give it after -- (the CLI), in "
                           "the job file or in the inventory's torchherd_job")
    job["run_id"] = job.get("run_id") or new_run_id()
    job["runs_dir"] = str(Path(runs_dir or job["runs_dir"] or DEFAULT_RUNS_DIR).resolve())
    given = job.get("code_src") or "."
    job["code_src"] = str(Path(given).expanduser().resolve())
    if not Path(job["code_src"]).is_dir():
        found = "a file" if Path(job["code_src"]).exists() else "no such directory"
        raise JobSpecError(f"job key 'code_src': expected a directory on this machine (the "
                           f"code synced to every node), found {found}: {given} "
                           f"({job['code_src']}); fix: give the directory that holds the "
                           f"script, relative to where torchherd runs or absolute")
    if (Path(job["runs_dir"]) / job["run_id"] / "plan.json").exists():
        raise JobSpecError(f"job key 'run_id': expected a new run id, found run "
                           f"{job['run_id']} already in {job['runs_dir']}; use status, stop "
                           f"or collect on it, or launch with another run id (or none)")
    return job


def _plugin_config(source: str) -> bool:
    """Whether the inventory source is a YAML file naming an inventory plugin."""
    path = Path(source)
    if not path.is_file() or path.suffix not in (".yml", ".yaml"):
        return False
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and "plugin" in data


def _may_hold_a_job(source: str) -> bool:
    """Whether Ansible could find a torchherd_job in this inventory source, told without
    Ansible's inventory: what reading it costs (its managers' imports, ~0.25 s) is on every
    launch's way to its first step. False only where none can be there: no file Ansible would
    read for the source's variables (the source itself, its group_vars and host_vars, every
    file of a source directory) names the key, none is vaulted, none is an inventory script,
    and Ansible's configuration enables no vars plugin beyond host_group_vars, nor puts any in
    a vars plugin path. Anything else (an unreadable file, a directory linked in) reads the
    inventory."""
    from ansible import constants

    enabled = set(constants.VARIABLE_PLUGINS_ENABLED or ()) - {"", "host_group_vars",
                                                               "ansible.builtin.host_group_vars"}
    legacy = [Path(d) for d in constants.DEFAULT_VARS_PLUGIN_PATH or () if Path(d).is_dir()]
    if enabled or any(any(d.iterdir()) for d in legacy):
        return True
    path = Path(source)
    if not path.exists():
        # An inline host list (node1,node2,) has no variables' files; anything else is for
        # Ansible to read (and to report).
        return "," not in source
    sources = [path] if path.is_file() else []
    roots = [path] if path.is_dir() else [path.parent / "group_vars", path.parent / "host_vars"]
    varfiles: list[Path] = []
    for root in roots:
        for top, dirs, files in os.walk(root):
            if any(Path(top, d).is_symlink() for d in dirs):
                return True
            varfiles += [Path(top, f) for f in files]
    if path.is_dir():
        sources = [f for f in varfiles
                   if not {"group_vars", "host_vars"} & set(f.relative_to(path).parts)]
    for file in {*sources, *varfiles}:
        if file in sources and os.access(file, os.X_OK):
            return True
        try:
            data = file.read_bytes()
        except OSError:
            return True
        if b"torchherd_job" in data or b"$ANSIBLE_VAULT" in data:
            return True
    return False


def inventory_job(source: str) -> tuple[str, dict[str, Any]]:
    """The job the inventory defines, and the host it was read from: as the plan role's
    default takes it (roles/plan/defaults/main.yml), the torchherd_job of the first inventory
    host that has one, templated. ("", {}) where none has one.

    The driver passes its job as extra vars, which hide the inventory's job from the plan:
    so it reads that job here, with Ansible's own inventory and variable managers, and puts the
    caller's keys over it."""
    if _plugin_config(source):
        # An inventory plugin's configuration (torchherd.cluster.slurm, say): the plugin is a
        # collection's, which this process does not load; ansible-playbook reads it, and the job
        # is the role's default there.
        return "", {}
    if not _may_hold_a_job(source):
        return "", {}
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    name = ""
    try:
        # The caller's vault passwords, as ansible-playbook takes them (the configuration's,
        # --vault-password-file, the one -J asked for): a vaulted group_vars file must not
        # stop the read.
        loader.set_vault_secrets(vault_secrets())
        try:
            inventory = InventoryManager(loader=loader, sources=[source])
        except AnsibleError:
            # A source only ansible-playbook's configuration reads (a collection's inventory
            # plugin, such as torchherd.cluster.slurm, which this process does not load):
            # ansible-playbook reports what is wrong with it, and its job is the role's default.
            return "", {}
        variables = VariableManager(loader=loader, inventory=inventory)
        # localhost first: the plan runs there, and a job its variables give (host_vars/
        # localhost, group_vars/all) is the role's value before its default looks at the nodes.
        for name in ["localhost", *inventory.get_groups_dict().get("all", [])]:
            hostvars = variables.get_vars(host=inventory.get_host(name), include_hostvars=False)
            if "torchherd_job" in hostvars:
                job = Templar(loader, variables=hostvars).template(hostvars["torchherd_job"])
                break
        else:
            return "", {}
    except AnsibleError as exc:
        raise JobSpecError(f"inventory {source}: torchherd_job{f' of host {name}' if name else ''}"
                           f": expected variables the driver can read, found {exc.message}; "
                           f"fix: correct the inventory (ansible-inventory -i {source} --list "
                           f"shows what Ansible reads), or, where a file is vaulted, give its "
                           f"password (--vault-password-file, -J, or vault_password_file in "
                           f"ansible.cfg)") from exc
    if not isinstance(job, dict):
        raise JobSpecError(f"inventory {source}: torchherd_job of host {name}: expected a "
                           f"mapping, found {type(job).__name__}; fix: correct it")
    # Plain data, as a job file gives it (Ansible's values carry its data tags).
    return name, json.loads(json.dumps(job))


def inventory_source(value: str | Path) -> str:
    """What ansible-playbook's -i takes, checked before anything runs: an inventory file or
    directory (absolute, so that status, stop and collect find it from anywhere), or an inline
    host list (``node1,node2,``) as Ansible reads it."""
    text = str(value)
    path = Path(text).expanduser()
    if path.exists():
        return str(path.resolve())
    if "," in text:
        return text
    raise UsageError(f"inventory {text}: expected an inventory file or directory, or an inline "
                     f"host list (node1,node2,), found no such file; fix: give the path of "
                     f"your inventory (e.g. inventories/cluster.ini)")


def runs_path(runs_dir: str | Path | None) -> Path:
    return Path(runs_dir or DEFAULT_RUNS_DIR).resolve()


def run_directory(run_id: str, runs_dir: str | Path | None) -> Path:
    """The directory of a past run on the controller; UsageError where it holds no plan."""
    run_dir = runs_path(runs_dir) / run_id
    if not (run_dir / "plan.json").is_file():
        raise UsageError(f"run {run_id}: expected {run_dir}/plan.json, found no such run; "
                         f"see `torchherd runs --runs-dir {run_dir.parent}`")
    return run_dir


def existing_run(run_id: str, runs_dir: str | Path | None,
                  inventory: str | Path | None) -> tuple[Path, str]:
    """The run's directory and inventory (given, or the one its launch recorded)."""
    run_dir = run_directory(run_id, runs_dir)
    if inventory is None:
        inventory = (read_json(run_dir / DRIVER_FILE) or {}).get("inventory")
        if not inventory:
            raise UsageError(f"run {run_id}: expected an inventory, found none given and none "
                             f"recorded by its launch; pass -i INVENTORY")
    return run_dir, inventory_source(inventory)
