"""The job spec: loaded from YAML and flags, checked against the collection's one definition.

The definition is the argument spec of the role torchherd.cluster.plan; reading that file
(not importing the collection) keeps the driver and the playbooks from ever disagreeing.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import re
from pathlib import Path
from typing import Any

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from driver.paths import job_spec_file
from driver.result import UsageError

# Ansible's documentation markup in the spec's descriptions: C(x), O(x), I(x), V(x).
_MARKUP = re.compile(r"[CIOV]\(([^)]*)\)")


class JobSpecError(UsageError):
    """A job spec that cannot run: names the key, the expected type and what was found."""


def job_options() -> dict[str, dict[str, Any]]:
    """Every job key with its type, default, choices and description."""
    return _role_spec()["torchherd_job"]["options"]


def _role_spec() -> dict[str, Any]:
    """The plan role's options, a copy of its own for each caller."""
    return copy.deepcopy(_parsed_spec(job_spec_file())["argument_specs"]["main"]["options"])


@functools.lru_cache(maxsize=4)
def _parsed_spec(path: Path) -> dict[str, Any]:
    """The argument spec file, parsed once per process: a launch reads it several times (flags,
    coercion, validation), and the pure-Python parser takes some 50 ms each time; libyaml's
    where PyYAML has it, some 7."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(path.read_text(encoding="utf-8"), Loader=loader)


def validate(job: dict[str, Any], source: str | None = None) -> dict[str, Any]:
    """Check the job as the plan role's argument validation does (ansible-core's own validator,
    so the same coercions, such as ``firewall: on``); return it coerced, with defaults filled
    in. A job that fails is refused in torchherd's words, one line per key (``job.master_port:
    expected an integer, found 'abc'``), then the fix, then what ansible-playbook says of the
    same job, word for word. ``source`` (e.g. ``job file job.yml``) heads the message."""
    result = ArgumentSpecValidator(_role_spec()).validate({"torchherd_job": job})
    if result.error_messages:
        problems = plain_problems(job, job_options()) or list(result.error_messages)
        raise JobSpecError((f"{source}: " if source else "")
                           + "expected a job torchherd can run, found:\n"
                           + "\n".join(f"  {p}" for p in problems)
                           + "\nfix: correct these keys of the job spec (`torchherd launch "
                             "--help` lists every key with its type and default)"
                           + "\nAnsible's validator says: Validation of arguments failed:\n"
                           + "\n".join(result.error_messages))
    return result.validated_parameters["torchherd_job"]


def _expected(opt: dict[str, Any], key: str = "") -> str:
    if key in _RAW:
        return _RAW[key][2]
    if opt.get("choices"):
        return "one of " + ", ".join(map(str, opt["choices"]))
    kind = opt.get("type", "str")
    if kind == "list":
        return f"a list of {opt.get('elements', 'str')}"
    if kind == "dict":
        keys = ", ".join(opt.get("options") or {})
        return f"a mapping ({keys})" if keys else "a mapping of NAME: value"
    return _EXPECTED.get(kind, f"a {kind}")


def plain_problems(job: Any, options: dict[str, dict[str, Any]], where: str = "job") -> list[str]:
    """What is wrong with each key of ``job`` against ``options``, in torchherd's words: an
    unknown key (with the closest known one), a value of the wrong type or not among the
    choices, a required key missing; the keys of a mapping key (container, venv) each on its
    own. Empty where the validator's complaint is none of these."""
    if not isinstance(job, dict):
        return [f"{where}: expected a mapping, found {job!r}"]
    problems = []
    for key, value in job.items():
        at = f"{where}.{key}"
        opt = options.get(key)
        if opt is None:
            close = difflib.get_close_matches(str(key), list(options), n=1)
            problems.append(f"{at}: expected a key of {where}, found an unknown key"
                            + (f"; did you mean {close[0]}?" if close else ""))
            continue
        if opt.get("options") and isinstance(value, dict):
            problems += plain_problems(value, opt["options"], at)
            continue
        alone = {k: v for k, v in opt.items() if k not in ("required", "options")}
        if ArgumentSpecValidator({key: alone}).validate({key: value}).error_messages:
            problems.append(f"{at}: expected {_expected(opt)}, found {value!r}")
    given = job if isinstance(job, dict) else {}
    problems += [f"{where}.{key}: expected a value ({_expected(opt)}), found none"
                 for key, opt in options.items() if opt.get("required") and key not in given]
    return problems


def sub_keys(key: str) -> list[str]:
    """The keys of a mapping job key (container, venv), each as ``name (type; choices;
    default; required): its description's first sentence``, for --help and init's job.yml."""
    described = []
    for name, opt in (job_options()[key].get("options") or {}).items():
        kind = opt.get("type", "str")
        if opt.get("elements"):
            kind = f"{kind} of {opt['elements']}"
        notes = [kind]
        if opt.get("choices"):
            notes.append("|".join(map(str, opt["choices"])))
        if opt.get("required"):
            notes.append("required")
        elif opt.get("default") not in (None, "", [], {}):
            notes.append(f"default {opt['default']}")
        text = opt.get("description", "")
        text = " ".join(text) if isinstance(text, list) else str(text)
        plain = " ".join(_MARKUP.sub(r"\1", text).split())
        first = re.split(r"\.\s+(?=[A-Z])", plain)[0].rstrip(".")
        described.append(f"{name} ({'; '.join(notes)}): {first}")
    return described


# The raw job keys, an integer or auto, which the spec's types cannot check: {key: (lowest,
# highest or None, what is expected)}. The driver checks them in the plan's own words where it
# reads a job (a job file, the inventory's job), before anything runs.
_RAW = {"nproc_per_node": (1, None, "a positive integer or 'auto'"),
        "master_port": (1, 65535, "an integer in 1..65535 or 'auto'")}


def raw_problem(key: str, value: Any) -> str | None:
    """What is wrong with the value of raw job key ``key`` (see _RAW), or None."""
    low, high, expected = _RAW[key]
    if value == "auto":
        return None
    text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(
        value, bool) else ""
    if text.isdigit() and int(text) >= low and (high is None or int(text) <= high):
        return None
    return f"job.{key}: expected {expected}, found {value!r}"


def raw_problems(job: dict[str, Any]) -> list[str]:
    """What is wrong with the raw keys ``job`` gives (the argument spec takes any value of
    them, and the plan refuses it later, naming no file): said where the job was read."""
    found = [raw_problem(key, job[key]) for key in _RAW if key in job]
    return [problem for problem in found if problem]


def coerce(key: str, text: str) -> Any:
    """A flag's value for job key ``key``, coerced by the same validator as the job file's;
    ValueError says what was expected and what was found."""
    opt = {k: v for k, v in job_options()[key].items() if k != "required"}
    result = ArgumentSpecValidator({key: opt}).validate({key: text})
    if result.error_messages or (key in _RAW and raw_problem(key, text)):
        raise ValueError(f"expected {_expected(opt, key)}, found {text!r}")
    value = result.validated_parameters[key]
    return int(value) if key in _RAW and value != "auto" else value


_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false",
             "str": "a string"}


def read_job_file(path: str | Path) -> dict[str, Any]:
    """The job keys of a YAML file (``torchherd_job:`` at the top, or the keys directly),
    not validated yet."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        data = (_vaulted(path) if "$ANSIBLE_VAULT" in text
                else yaml.safe_load(text)) or {}
    except OSError as exc:
        raise JobSpecError(f"job file {path}: cannot read it: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise JobSpecError(f"job file {path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise JobSpecError(f"job file {path}: expected a mapping, found {type(data).__name__}")
    job = data.get("torchherd_job", data)
    if not isinstance(job, dict):
        raise JobSpecError(f"job file {path}: expected torchherd_job to be a mapping, found "
                           f"{type(job).__name__}")
    return dict(job)


def _vaulted(path: str | Path) -> Any:
    """A job file encrypted with ansible-vault (whole, or values tagged !vault), read as
    ansible-playbook reads it with the same passwords (driver.ansible_options): plain data."""
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultSecretsContext

    from driver.ansible_options import vault_secrets

    secrets = vault_secrets()
    loader = DataLoader()
    loader.set_vault_secrets(secrets)
    if VaultSecretsContext.current(optional=True) is None:
        # Values tagged !vault decrypt through Ansible's one context of the process's secrets,
        # as in ansible-playbook.
        VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    try:
        data = loader.load_from_file(str(path))
        # Plain data, as a job file gives it (decrypted values, without Ansible's tags).
        return json.loads(json.dumps(data, default=str))
    except AnsibleError as exc:
        raise JobSpecError(f"job file {path}: expected a vaulted file this driver can decrypt, "
                           f"found: {exc.message}; fix: give its password "
                           f"(--vault-password-file FILE, -J, or vault_password_file in "
                           f"ansible.cfg)") from exc


def load_job(path: str | Path | None = None, **overrides: Any) -> dict[str, Any]:
    """Load a job file and apply overrides (None means not given); the result is validated."""
    job = read_job_file(path) if path else {}
    job.update({k: v for k, v in overrides.items() if v is not None})
    return validate(job)
