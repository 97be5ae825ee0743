"""The job spec: loaded from YAML and flags, checked against the collection's one definition.

The definition is the argument spec of the role torchherd.cluster.plan; reading that file
(not importing the collection) keeps the driver and the playbooks from ever disagreeing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from driver.paths import job_spec_file
from driver.result import UsageError


class JobSpecError(UsageError):
    """A job spec that cannot run: names the key, the expected type and what was found."""


def job_options() -> dict[str, dict[str, Any]]:
    """Every job key with its type, default, choices and description."""
    return _role_spec()["torchherd_job"]["options"]


def _role_spec() -> dict[str, Any]:
    spec = yaml.safe_load(job_spec_file().read_text(encoding="utf-8"))
    return spec["argument_specs"]["main"]["options"]


def validate(job: dict[str, Any]) -> dict[str, Any]:
    """Check the job as the plan role's argument validation does (ansible-core's own validator,
    so the same coercions, such as ``firewall: on``, and the same messages); return it coerced,
    with defaults filled in."""
    result = ArgumentSpecValidator(_role_spec()).validate({"torchherd_job": job})
    if result.error_messages:
        # All but the fix is what ansible-playbook says for the same job, word for word.
        raise JobSpecError("Validation of arguments failed:\n"
                           + "\n".join(result.error_messages)
                           + "\nfix: correct these keys of the job spec "
                             "(`torchherd launch --help` lists every key with its type)")
    return result.validated_parameters["torchherd_job"]


def read_job_file(path: str | Path) -> dict[str, Any]:
    """The job keys of a YAML file (``torchherd_job:`` at the top, or the keys directly),
    not validated yet."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
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


def load_job(path: str | Path | None = None, **overrides: Any) -> dict[str, Any]:
    """Load a job file and apply overrides (None means not given); the result is validated."""
    job = read_job_file(path) if path else {}
    job.update({k: v for k, v in overrides.items() if v is not None})
    return validate(job)
