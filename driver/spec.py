"""The job spec: loaded from YAML and flags, checked against the collection's one definition.

The definition is the argument spec of the role torchherd.cluster.plan; reading that file
(not importing the collection) keeps the driver and the playbooks from ever disagreeing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from driver.paths import job_spec_file
from driver.result import UsageError


class JobSpecError(UsageError):
    """A job spec that cannot run: names the key, the expected type and what was found."""


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "bool": (bool,), "list": (list,), "dict": (dict,),
    "float": (int, float),
}


_BOOLS = {"true": True, "yes": True, "false": False, "no": False}


def job_options() -> dict[str, dict[str, Any]]:
    """Every job key with its type, default, choices and description."""
    spec = yaml.safe_load(job_spec_file().read_text(encoding="utf-8"))
    return spec["argument_specs"]["main"]["options"]["torchherd_job"]["options"]


def _check_type(key: str, value: Any, opt: dict[str, Any]) -> Any:
    kind = opt.get("type", "str")
    if kind == "raw" or value is None:
        return value
    if kind == "int" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if kind == "bool" and isinstance(value, str) and value.lower() in _BOOLS:
        value = _BOOLS[value.lower()]
    ok = isinstance(value, _PY_TYPES[kind]) and not (kind == "int" and isinstance(value, bool))
    if not ok:
        raise JobSpecError(f"job key '{key}': expected {kind}, found "
                           f"{type(value).__name__} {value!r}")
    if kind == "list" and opt.get("elements") == "str":
        bad = [v for v in value if not isinstance(v, (str, int, float)) or isinstance(v, bool)]
        if bad:
            raise JobSpecError(f"job key '{key}': expected a list of strings, found {bad[0]!r}")
        value = [str(v) for v in value]
    if opt.get("choices") and value not in opt["choices"]:
        raise JobSpecError(f"job key '{key}': expected one of {opt['choices']}, found {value!r}")
    return value


def validate(job: dict[str, Any]) -> dict[str, Any]:
    """Check keys and types; return the job with defaults filled in."""
    options = job_options()
    unknown = sorted(set(job) - set(options))
    if unknown:
        raise JobSpecError(f"job key '{unknown[0]}': unknown; known keys: "
                           f"{', '.join(sorted(options))}")
    out: dict[str, Any] = {}
    for key, opt in options.items():
        if key in job and job[key] is not None:
            out[key] = _check_type(key, job[key], opt)
        elif opt.get("required"):
            raise JobSpecError(f"job key '{key}': required ({opt.get('description', '')})")
        else:
            out[key] = opt.get("default")
    return out


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
