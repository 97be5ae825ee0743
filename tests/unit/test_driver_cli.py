"""The CLI's job spec from flags and files, its usage errors and the --json schema."""

import json
from pathlib import Path

import jsonschema
import pytest

from driver import cli
from driver.result import Exit, RunResult

SCHEMA = json.loads((Path(cli.__file__).parent / "schema.json").read_text())


def job(*argv):
    return cli.job_from(cli.build_parser().parse_args(["launch", "-i", "inv", *argv]))


def test_flags_and_script_after_double_dash():
    spec = job("--nproc-per-node", "2", "--master-port", "29600", "--detach", "-e", "A=1",
               "--artifacts", "*.pt", "--artifacts", "logs/*", "--", "train.py", "--lr", "3")
    assert spec["script"] == "train.py" and spec["args"] == ["--lr", "3"]
    assert spec["nproc_per_node"] == "2" and spec["master_port"] == 29600
    assert spec["detach"] is True and spec["env"] == {"A": "1"}
    assert spec["artifacts"] == ["*.pt", "logs/*"]


def test_job_file_with_flags_adding_variables(tmp_path, monkeypatch):
    path = tmp_path / "job.yml"
    path.write_text("torchherd_job:\n  script: a.py\n  env: {B: '2'}\n  secret_env: {S: x}\n")
    monkeypatch.setenv("TOKEN", "v")
    spec = job("-j", str(path), "-e", "A=1", "--secret-env", "TOKEN")
    assert spec["script"] == "a.py"
    assert spec["env"] == {"B": "2", "A": "1"}
    assert spec["secret_env"] == {"S": "x", "TOKEN": "v"}


@pytest.mark.parametrize("argv,expected", [
    (["--", "t.py", "--master-port"], None),  # script args are the script's
    (["--master-port", "abc", "--", "t.py"],
     "argument 'master_port' is of type str found in 'torchherd_job'. and we were unable to "
     "convert to int"),
    (["--rdzv", "etcd", "--", "t.py"], "value of rdzv must be one of: static, c10d, got: etcd"),
    (["-e", "NOEQUALS", "--", "t.py"], "--env 'NOEQUALS': expected KEY=VALUE"),
    (["--secret-env", "TORCHHERD_UNSET_VAR", "--", "t.py"], "expected TORCHHERD_UNSET_VAR in"),
    ([], "job key 'script': required"),
])
def test_spec_errors_name_the_key(argv, expected):
    if expected is None:
        assert job(*argv)["args"] == ["--master-port"]
        return
    with pytest.raises(cli.UsageError, match=expected.replace("(", r"\(")):
        job(*argv)


def test_usage_errors_exit_2_before_ansible(capsys, tmp_path):
    # An unknown flag (no abbreviations either) is argparse's usage error.
    with pytest.raises(SystemExit) as exc:
        cli.main(["launch", "-i", "inv", "--nproc", "2", "--", "t.py"])
    assert exc.value.code == 2
    assert cli.main(["launch", "-i", "inv", "--timeout", "soon", "--", "t.py"]) == Exit.USAGE
    assert ("argument 'timeout' is of type str found in 'torchherd_job'. and we were unable to "
            "convert to int" in capsys.readouterr().err)
    assert cli.main(["status", "nope", "--runs-dir", str(tmp_path)]) == Exit.USAGE
    assert "run nope: expected" in capsys.readouterr().err


def test_run_result_document_matches_the_schema(tmp_path):
    result = RunResult("r1", tmp_path, "launch", "failed", Exit.JOB_FAILED, "n1 rank 3: boom",
                       hosts={"n0": {"node_rank": 0, "state": "stopped", "exit_code": -15,
                                     "log": None, "artifacts": []}},
                       timings={"total": 1.5},
                       summary={"world_size": 4, "nproc_per_node": 2, "nnodes": "2",
                                "master": {"host": "n0", "addr": "10.0.0.1", "port": 29500}})
    jsonschema.validate(result.to_dict(), SCHEMA)
    bad = dict(result.to_dict(), exit_code=7)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_runs_json_matches_the_schema(tmp_path, capsys):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "plan.json").write_text(json.dumps(
        {"started_at": 1.0, "nodes": [{"host": "n0", "node_rank": 0}]}))
    assert cli.main(["runs", "--runs-dir", str(tmp_path), "--json"]) == Exit.OK
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["runs"][0]["run_id"] == "r1" and doc["runs"][0]["state"] == "unknown"
