"""The driver's job spec check: same keys, types and defaults as the role argument spec."""

import pytest
import yaml

from driver.paths import collection_dir
from driver.spec import JobSpecError, load_job, validate


def test_defaults_filled_from_the_argument_spec():
    job = validate({"script": "train.py"})
    assert job["master_port"] == 29500 and job["nproc_per_node"] == "auto"
    assert job["args"] == [] and job["node_group"] == "torchherd_nodes"


def test_unknown_key_is_named_with_the_known_ones():
    with pytest.raises(JobSpecError, match="job key 'nproc': unknown; known keys: .*nproc_per"):
        validate({"script": "t.py", "nproc": 2})


@pytest.mark.parametrize("key,value,expected", [
    ("master_port", "abc", "expected int, found str 'abc'"),
    ("args", "--epochs 3", "expected list"),
    ("env", ["A=1"], "expected dict"),
    ("detach", "maybe", "expected bool"),
    ("rdzv", "etcd", "expected one of \\['static', 'c10d'\\]"),
    ("master_port", True, "expected int, found bool"),
])
def test_wrong_types_name_key_and_type(key, value, expected):
    with pytest.raises(JobSpecError, match=f"job key '{key}': {expected}"):
        validate({"script": "t.py", key: value})


def test_missing_script():
    with pytest.raises(JobSpecError, match="job key 'script': required"):
        validate({})


def test_strings_from_flags_are_coerced():
    job = validate({"script": "t.py", "master_port": "29600", "detach": "yes", "args": [1, "x"]})
    assert job["master_port"] == 29600 and job["detach"] is True and job["args"] == ["1", "x"]


def test_job_file_with_or_without_top_key(tmp_path):
    wrapped = tmp_path / "a.yml"
    wrapped.write_text("torchherd_job:\n  script: a.py\n  nproc_per_node: 2\n")
    flat = tmp_path / "b.yml"
    flat.write_text("script: b.py\n")
    assert load_job(wrapped)["nproc_per_node"] == 2
    assert load_job(flat, script="c.py")["script"] == "c.py"


def test_bad_yaml_file(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("script: [unclosed\n")
    with pytest.raises(JobSpecError, match="not valid YAML"):
        load_job(bad)


def test_role_defaults_agree_with_the_argument_specs():
    """A role default file and its argument spec must not disagree on a default."""
    for role in (collection_dir() / "roles").iterdir():
        spec_file, defaults_file = role / "meta/argument_specs.yml", role / "defaults/main.yml"
        if not (spec_file.exists() and defaults_file.exists()):
            continue
        defaults = yaml.safe_load(defaults_file.read_text()) or {}
        for entry in yaml.safe_load(spec_file.read_text())["argument_specs"].values():
            for key, opt in (entry.get("options") or {}).items():
                if key in defaults and "default" in opt and "{{" not in str(defaults[key]):
                    assert opt["default"] == defaults[key], f"{role.name}: {key}"
