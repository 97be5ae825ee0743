"""The driver's job spec check: ansible-core's validator on the plan role's argument spec."""

import pytest
import yaml

from driver.paths import collection_dir
from driver.spec import (
    JobSpecError,
    coerce,
    job_options,
    load_job,
    raw_problem,
    raw_problems,
    validate,
)


def test_defaults_filled_from_the_argument_spec():
    job = validate({"script": "train.py"})
    assert job["master_port"] == 29500 and job["nproc_per_node"] == "auto"
    assert job["args"] == [] and job["node_group"] == "torchherd_nodes"
    assert set(job) == set(job_options())


def test_unknown_key_is_named_with_the_known_ones():
    with pytest.raises(JobSpecError, match=r"torchherd_job\.nproc\. Supported parameters "
                                           r"include: .*nproc_per_node"):
        validate({"script": "t.py", "nproc": 2})


@pytest.mark.parametrize("key,value,ours,ansibles", [
    ("max_restarts", "abc", "job.max_restarts: expected an integer, found 'abc'",
     "argument 'max_restarts' is of type str found in 'torchherd_job'. "
     "and we were unable to convert to int"),
    ("env", ["A=1"], "job.env: expected a mapping of NAME: value, found ['A=1']",
     "argument 'env' is of type list found in 'torchherd_job'. "
     "and we were unable to convert to dict"),
    ("detach", "maybe", "job.detach: expected true or false, found 'maybe'",
     "The value 'maybe' is not a valid boolean"),
    ("rdzv", "etcd", "job.rdzv: expected one of static, c10d, found 'etcd'",
     "value of rdzv must be one of: static, c10d, got: etcd"),
    ("container", {"image": "x", "pull": "now"},
     "job.container.pull: expected one of missing, always, never, found 'now'",
     "value of pull must be one of: missing, always, never, got: now"),
    ("venv", {"lok": "r.txt"},
     "job.venv.lok: expected a key of job.venv, found an unknown key; did you mean lock?",
     "torchherd_job.venv.lok. Supported parameters include: "),
])
def test_wrong_types_in_torchherds_words_then_ansibles(key, value, ours, ansibles):
    with pytest.raises(JobSpecError) as info:
        validate({"script": "t.py", key: value})
    message = str(info.value)
    assert message.startswith("expected a job torchherd can run, found:\n  " + ours + "\n")
    head, _, ansible = message.partition("\nAnsible's validator says: ")
    assert "\nfix: " in head and ansible.startswith("Validation of arguments failed:\n")
    assert ansibles in ansible


def test_every_problem_is_reported_at_once():
    with pytest.raises(JobSpecError) as info:
        validate({"script": "t.py", "timeout": "x", "backend": "mpi", "zz": 1})
    ours = str(info.value).split("\nfix: ")[0].splitlines()[1:]
    assert [line.split(":")[0].strip() for line in ours] == ["job.timeout", "job.backend",
                                                             "job.zz"]


def test_no_script_is_a_job_less_verify():
    # A launch without one is refused by the driver and by the plan (playbook launch).
    assert validate({})["script"] == ""


def test_a_typod_key_gets_the_closest_one():
    with pytest.raises(JobSpecError) as info:
        validate({"script": "t.py", "nproc_per_nod": 2, "zzzzzz": 1}, "job file j.yml")
    message = str(info.value)
    assert message.startswith("job file j.yml: expected a job torchherd can run, found:\n")
    assert ("  job.nproc_per_nod: expected a key of job, found an unknown key; did you mean "
            "nproc_per_node?\n") in message
    assert "  job.zzzzzz: expected a key of job, found an unknown key\n" in message


@pytest.mark.parametrize("value,ok", [
    ("auto", True), (2, True), ("4", True), (0, False), ("abc", False), (True, False),
    (-1, False), ("", False), ("Auto", False), (1.5, False),
])
def test_nproc_per_node_in_the_plans_words(value, ok):
    problem = raw_problem("nproc_per_node", value)
    assert (problem is None) == ok
    if not ok:
        assert problem == (f"job.nproc_per_node: expected a positive integer or 'auto', found "
                           f"{value!r}")


@pytest.mark.parametrize("value,ok", [
    ("auto", True), (29500, True), ("29501", True), (1, True), (65535, True), (0, False),
    (65536, False), ("abc", False), (True, False), (1.5, False), ("", False),
])
def test_master_port_a_number_or_auto_in_the_plans_words(value, ok):
    problem = raw_problem("master_port", value)
    assert (problem is None) == ok
    if not ok:
        assert problem == (f"job.master_port: expected an integer in 1..65535 or 'auto', found "
                           f"{value!r}")


def test_raw_keys_the_argument_spec_lets_through_are_named_in_the_plans_words():
    # The validator takes any value of a raw key, as the plan role's argument spec does.
    job = {"script": "t.py", "master_port": "abc", "nproc_per_node": 0}
    assert validate(job)["master_port"] == "abc"
    assert raw_problems(job) == [
        "job.nproc_per_node: expected a positive integer or 'auto', found 0",
        "job.master_port: expected an integer in 1..65535 or 'auto', found 'abc'"]
    assert raw_problems({"master_port": "auto", "nproc_per_node": "2"}) == []


@pytest.mark.parametrize("key,text,expected", [
    ("nproc_per_node", "3", 3), ("nproc_per_node", "auto", "auto"), ("detach", "yes", True),
    ("master_port", "29600", 29600), ("master_port", "auto", "auto"), ("backend", "gloo", "gloo"),
])
def test_flag_values_coerced_by_the_same_validator(key, text, expected):
    assert coerce(key, text) == expected


@pytest.mark.parametrize("key,text,expected", [
    ("nproc_per_node", "x", "expected a positive integer or 'auto', found 'x'"),
    ("master_port", "x", "expected an integer in 1..65535 or 'auto', found 'x'"),
    ("master_port", "70000", "expected an integer in 1..65535 or 'auto', found '70000'"),
    ("backend", "mpi", "expected one of auto, gloo, nccl, found 'mpi'"),
])
def test_bad_flag_values_say_what_was_expected(key, text, expected):
    with pytest.raises(ValueError, match=expected):
        coerce(key, text)


def test_coerced_as_ansible_coerces():
    job = validate({"script": "t.py", "timeout": "600", "detach": "yes", "firewall": "on",
                    "firewall_persistent": 1, "args": [1, "x"]})
    assert job["timeout"] == 600 and job["args"] == ["1", "x"]
    assert job["detach"] is True and job["firewall"] is True
    assert job["firewall_persistent"] is True
    assert validate({"script": "t.py", "firewall": "off"})["firewall"] is False


def test_the_callers_job_is_left_alone():
    job = {"script": "t.py", "master_port": "29600"}
    validate(job)
    assert job == {"script": "t.py", "master_port": "29600"}


def test_job_file_with_or_without_top_key(tmp_path):
    wrapped = tmp_path / "a.yml"
    wrapped.write_text("torchherd_job:\n  script: a.py\n  nproc_per_node: 2\n")
    flat = tmp_path / "b.yml"
    flat.write_text("script: b.py\n")
    assert load_job(wrapped)["nproc_per_node"] == 2
    assert load_job(flat, script="c.py", master_port=None)["script"] == "c.py"
    assert load_job(flat, master_port=None)["master_port"] == 29500


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


def test_a_required_key_missing_and_a_value_that_is_no_mapping_are_named():
    from driver.spec import plain_problems
    options = {"a": {"type": "str", "required": True}, "b": {"type": "int"}}
    assert plain_problems({"b": 1}, options) == ["job.a: expected a value (a string), found none"]
    assert plain_problems(["x"], options, "job.venv") == ["job.venv: expected a mapping, found "
                                                          "['x']"]
    assert plain_problems({"a": "x", "b": 2}, options) == []
