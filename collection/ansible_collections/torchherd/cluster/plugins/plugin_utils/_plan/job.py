# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The job as the plan sees it: coerced by the plan role's argument spec, and the checks that
need nothing but the job."""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Mapping

import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS

SPEC_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
    "roles", "plan", "meta", "argument_specs.yml",
)
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@functools.lru_cache(maxsize=1)
def _spec():
    # libyaml where PyYAML has it: the pure-Python parser takes a tenth of a second for this
    # file, on every launch's critical path.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(SPEC_PATH, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=loader)["argument_specs"]["main"]["options"]


def job_spec():
    """The C(main) options of the plan role's argument spec (the one definition); parsed once
    per process (the plan is made more than once per launch), a copy each time (the validator
    may change what it is given)."""
    return copy.deepcopy(_spec())


def _plain(value):
    """`value` as plain Python data. Ansible hands a filter its own lazy containers and tagged
    values, which the validator deep-copies with everything they carry (origins, templating
    state): over a second per plan where plain data takes milliseconds."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for kind in (bool, str, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value


def normalize(job):
    """The job as the role's argument validation sees it, coerced and with defaults.

    Role validation checks the job but hands the plan the raw values (C(firewall: "off") is a
    true string), so the plan runs the same validator to take the coerced ones. It also refuses,
    with Ansible's own words, a job that skipped validation (rolespec_validate false)."""
    given = {k: _plain(v) for k, v in job.items() if v is not None}
    result = ArgumentSpecValidator(job_spec()).validate({"torchherd_job": given})
    if result.error_messages:
        raise AnsibleFilterError("torchherd plan: Validation of arguments failed:\n"
                                 + "\n".join(result.error_messages))
    return result.validated_parameters["torchherd_job"]


def script_path(job, playbook, problems):
    """The script as the nodes run it: relative to the code directory the sync fills. The
    start runs it there, so an absolute path inside code_src becomes relative to it, and one
    outside would never reach the nodes (only the code directory is synced): a problem. A
    launch needs one; a verify checks the nodes also without one."""
    script = str(job.get("script") or "").strip()
    if not script and playbook != "verify":
        problems.append("job.script: expected the training script's path, found nothing; "
                        "fix: set torchherd_job.script (e.g. train.py)")
    if not os.path.isabs(script):
        return script
    src = os.path.realpath(os.path.expanduser(job["code_src"] or "."))
    # The directory resolved as code_src is, the file not: a link in code_src is the code's.
    inside = os.path.relpath(os.path.join(os.path.realpath(os.path.dirname(script)),
                                          os.path.basename(script)), src)
    if inside == os.pardir or inside.startswith(os.pardir + os.sep):
        problems.append(f"job.script: expected a path inside code_src {src} (the directory "
                        f"synced to the nodes), found {script}; fix: put the script under "
                        f"code_src and give its path relative to it, or set code_src to a "
                        f"directory that holds it")
        return script
    return inside


def master_port(job, problems):
    """The job's master port: an integer in 1..65535 (YAML's or a flag's text of one too), or
    auto, which the master resolves in preflight (a free port it picks: the gate's
    master_port)."""
    port = job["master_port"]
    if port == "auto":
        return port
    text = str(port).strip()
    if not isinstance(port, bool) and text.isdigit() and 1 <= int(text) <= 65535:
        return int(text)
    problems.append(f"job.master_port: expected an integer in 1..65535 or 'auto', found {port!r}; "
                    f"fix: set torchherd_job.master_port (torchrun's default is 29500; auto "
                    f"picks a free one on the master)")
    return port


def launcher_problems(job, nprocs):
    """What the job's launcher refuses of the job and of the nodes' process counts
    (``nprocs``), and the launcher options the plan sets itself."""
    launcher = LAUNCHERS[job["launcher"]]
    problems = list(launcher.constraints(job, nprocs))
    for arg in job["launcher_args"]:
        option = str(arg).split("=", 1)[0]
        if option in launcher.PLANNED_OPTIONS:
            problems.append(f"job.launcher_args: expected options of {launcher.NAME} that the plan "
                            f"does not set, found {option}; fix: leave it out (torchherd sets it "
                            f"from the inventory and the job: node rank, node count, master "
                            f"address and port, processes per node, logs)")
    return problems


def bound_problems(job):
    """The job's counts and durations outside their ranges."""
    problems = []
    for key, low in (("max_restarts", 0), ("timeout", 0), ("watch_interval", 1),
                     ("hang_timeout", 0), ("interconnect_max_age", 0)):
        if job[key] < low:
            problems.append(f"job.{key}: expected an integer >= {low}, found {job[key]!r}")
    if job.get("sample_interval", 5) < 0:
        problems.append(f"job.sample_interval: expected a number of seconds >= 0 (0: no "
                        f"samples), found {job['sample_interval']!r}")
    for key in ("probe_timeout", "probe_window"):
        if job[key] <= 0:
            problems.append(f"job.{key}: expected a number of seconds > 0, found {job[key]!r}")
    for key in ("interconnect_min_busbw", "interconnect_min_link_share"):
        if job[key] < 0:
            problems.append(f"job.{key}: expected a number >= 0, found {job[key]!r}")
    return problems


def secret_problems(job, hosts, hostvars):
    """The nodes whose own job (their torchherd_job, as each sees it) lacks a secret the plan
    names: each node's start takes the values from there, so a job given for localhost alone
    would start without them. Names only, never values; without secrets no node's variables
    are read (each read costs the controller a templating of the node's variables)."""
    wanted = list(job["secret_env"])
    if not wanted:
        return []
    missing = []
    for host in hosts:
        seen = (hostvars[host].get("torchherd_job") if host in hostvars else None) or {}
        names = seen.get("secret_env") if isinstance(seen, Mapping) else None
        if not isinstance(names, Mapping) or not set(wanted) <= set(names):
            missing.append(host)
    if not missing:
        return []
    return [f"hosts {', '.join(missing)}: job.secret_env: expected {', '.join(wanted)} in the job "
            "each node sees (torchherd_job: the start takes the values from there), found them "
            "missing; fix: give the job as extra vars (-e @job.yml) or in group_vars of the "
            "nodes, not for localhost alone"]


def id_problems(run_id, name):
    """The run id and the job's name as they name directories."""
    return [f"job.{key}: expected letters, digits, '.', '_' or '-' (it names directories), "
            f"found {value!r}"
            for key, value in (("run_id", run_id), ("name", name))
            if value and not _SAFE_ID.match(str(value))]


def job_name(job, script):
    """The job's name, else its script's, made fit to name a directory."""
    name = job["name"] or os.path.splitext(os.path.basename(script))[0] or "job"
    if not _SAFE_ID.match(name):
        name = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip("._-") or "job"
    return name


def standby_mode(job):
    """Whether the job's restarts are torchrun's own, on the nodes (a detached job that allows
    restarts): the spares then wait in its elastic rendezvous as standbys (see the schedule's
    restart.by)."""
    return bool(job.get("detach")) and int(job.get("restarts") or 0) > 0


def standby_problems(job):
    """Why a detached job with restarts cannot have them on its nodes (torchrun's elastic
    restarts, which need no controller), or nothing."""
    if not standby_mode(job):
        return []
    problems = []
    fix = "; fix: {}, or launch without detach (the driver's watch then restarts the job)"
    if job["launcher"] != "torchrun" or job["rdzv"] != "c10d":
        problems.append(
            f"job.restarts with detach: expected launcher torchrun with rdzv c10d (a detached "
            f"job's restarts are torchrun's own elastic restarts, whose rendezvous takes a "
            f"standby spare in), found launcher {job['launcher']} with rdzv {job['rdzv']}"
            + fix.format("set rdzv: c10d"))
    if "exception" not in (job.get("restart_on") or []):
        problems.append(
            f"job.restart_on with detach: expected it to name exception too (torchrun restarts "
            f"its workers after any failure, an exception of the job's own code included, and "
            f"cannot tell the kinds apart), found {', '.join(job.get('restart_on') or [])}"
            + fix.format("add exception to restart_on"))
    if job["max_restarts"] not in (0, job["restarts"]):
        problems.append(
            f"job.max_restarts with detach and restarts: expected 0 or {job['restarts']} "
            f"(torchrun's restarts are the job's restarts then), found {job['max_restarts']}"
            + fix.format("drop max_restarts"))
    return problems
