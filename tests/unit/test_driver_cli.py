"""The CLI: job spec from flags and files, usage errors, the --json schema, and the
conventions of a command line (--version, help, completion, piped output, environment)."""

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from driver import arguments, cli, ui
from driver.result import Exit, RunResult

SCHEMA = json.loads((Path(cli.__file__).parent / "schema.json").read_text())


def job(*argv):
    return arguments.job_from(arguments.build_parser().parse_args(["launch", "-i", "inv", *argv]))


def test_flags_and_script_after_double_dash():
    spec = job("--nproc-per-node", "2", "--master-port", "29600", "--detach", "-e", "A=1",
               "--artifacts", "*.pt", "--artifacts", "logs/*", "--", "train.py", "--lr", "3")
    assert spec["script"] == "train.py" and spec["args"] == ["--lr", "3"]
    assert spec["nproc_per_node"] == 2 and spec["master_port"] == 29600
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
    (["-e", "NOEQUALS", "--", "t.py"], "--env 'NOEQUALS': expected KEY=VALUE"),
    # ansible-playbook's way of giving the job file is not ours: say which is.
    (["-e", "@job.yml", "--", "t.py"],
     "--env '@job.yml': expected KEY=VALUE, found a file; torchherd takes the job file with "
     "-j/--job FILE"),
    (["--secret-env", "TORCHHERD_UNSET_VAR", "--", "t.py"], "expected TORCHHERD_UNSET_VAR in"),
])
def test_spec_errors_name_the_key(argv, expected):
    if expected is None:
        assert job(*argv)["args"] == ["--master-port"]
        return
    with pytest.raises(cli.UsageError, match=expected.replace("(", r"\(")):
        job(*argv)


def test_usage_errors_exit_2_before_ansible(capsys, tmp_path):
    # An unknown flag (no abbreviations either) is argparse's usage error.
    assert cli.main(["launch", "-i", "inv", "--nproc", "2", "--", "t.py"]) == Exit.USAGE
    err = capsys.readouterr().err
    assert "usage: torchherd launch" in err and "unrecognized arguments: --nproc" in err
    assert cli.main(["launch", "-i", "inv", "--timeout", "soon", "--", "t.py"]) == Exit.USAGE
    assert "argument --timeout: expected an integer, found 'soon'" in capsys.readouterr().err
    assert cli.main(["status", "nope", "--runs-dir", str(tmp_path)]) == Exit.USAGE
    assert "run nope: expected" in capsys.readouterr().err


@pytest.mark.parametrize("argv,expected", [
    (["--nproc-per-node", "abc"], "argument --nproc-per-node: expected a positive integer or "
                                  "'auto', found 'abc'"),
    (["--nproc-per-node", "0"], "argument --nproc-per-node: expected a positive integer"),
    (["--master-port", "abc"], "argument --master-port: expected an integer in 1..65535 or "
                               "'auto', found 'abc'"),
    (["--rdzv", "etcd"], "argument --rdzv: expected one of static, c10d, found 'etcd'"),
    (["--firewall", "maybe"], "argument --firewall: expected true or false, found 'maybe'"),
])
def test_a_bad_flag_value_is_named_by_the_flag(argv, expected):
    with pytest.raises(cli.UsageError, match=expected):
        job(*argv, "--", "t.py")


def test_flag_values_coerced_as_the_job_files():
    spec = job("--nproc-per-node", "auto", "--firewall", "on", "--timeout", "60", "--", "t.py")
    assert spec["nproc_per_node"] == "auto" and spec["firewall"] is True
    assert spec["timeout"] == 60


def test_a_bad_value_in_the_job_file_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "job.yml"
    path.write_text("script: t.py\nnproc_per_node: abc\ntimeout: x\nnproc_per_nod: 2\n")
    with pytest.raises(cli.UsageError) as info:
        job("-j", str(path))
    message = str(info.value)
    assert message.startswith(f"job file {path}: expected a job torchherd can run, found:\n")
    assert "\n  job.timeout: expected an integer, found 'x'\n" in message
    assert ("\n  job.nproc_per_nod: expected a key of job, found an unknown key; did you mean "
            "nproc_per_node?\n") in message
    # Ansible's own words come last, for a search of the error or a user of ansible-playbook.
    assert "\nAnsible's validator says: Validation of arguments failed:\n" in message


def test_a_bad_master_port_in_the_job_file_is_named_in_torchherds_words(tmp_path):
    path = tmp_path / "job.yml"
    path.write_text("script: t.py\nmaster_port: abc\n")
    with pytest.raises(cli.UsageError) as info:
        job("-j", str(path))
    assert str(info.value).startswith(f"job file {path}: job.master_port: expected an integer "
                                      f"in 1..65535 or 'auto', found 'abc'; fix: ")
    assert "is of type" not in str(info.value)  # not ansible-core's words
    path.write_text("script: t.py\nmaster_port: auto\n")
    assert job("-j", str(path))["master_port"] == "auto"


def test_a_bad_key_value_pair_is_named_by_its_flag_not_the_job_file(tmp_path):
    path = tmp_path / "job.yml"
    path.write_text("script: t.py\n")
    with pytest.raises(cli.UsageError) as info:
        job("-j", str(path), "--container", "imag=x")
    assert str(info.value).startswith(f"--container over job file {path}: expected a job ")
    assert "job.container.imag: expected a key of job.container, found an unknown key; did " \
           "you mean image?" in str(info.value)
    with pytest.raises(cli.UsageError, match=r"^--venv: .*\n  job.venv.system_site_packages: "
                                             r"expected true or false, found 'maybe'"):
        job("--venv", "lock=r.txt", "--venv", "system_site_packages=maybe", "--", "t.py")
    path.write_text("script: t.py\nnproc_per_node: abc\n")
    with pytest.raises(cli.UsageError, match=f"job file {path}: job.nproc_per_node: expected a "
                                             f"positive integer or 'auto', found 'abc'"):
        job("-j", str(path))
    # The flag's value replaces the file's bad one.
    assert job("-j", str(path), "--nproc-per-node", "2")["nproc_per_node"] == 2


@pytest.mark.parametrize("argv,expected", [
    (["--nproc-per-nod", "2"], "unrecognized arguments: --nproc-per-nod; did you mean "
                               "--nproc-per-node?"),
    (["--master-prot=29600"], "did you mean --master-port?"),
    (["--extra-vars", "@job.yml"], "unrecognized arguments: --extra-vars (torchherd takes the "
                                   "job file with -j/--job FILE"),
])
def test_a_typod_flag_gets_the_closest_one(argv, expected, capsys):
    assert cli.main(["launch", "-i", "inv", *argv, "--", "t.py"]) == Exit.USAGE
    err = capsys.readouterr().err
    assert "usage: torchherd launch" in err and expected in err


def test_a_typod_action_gets_the_closest_one(capsys):
    assert cli.main(["verfy", "-i", "inv"]) == Exit.USAGE
    assert "invalid choice: 'verfy'" in capsys.readouterr().err
    with pytest.raises(cli.UsageError, match="did you mean verify?"):
        arguments.build_parser().parse_args(["verfy"])


def test_no_suggestion_for_a_flag_like_none():
    assert arguments.build_parser().commands["launch"].hint(["--zzzzzz"]) == ""


def test_keys_not_given_are_left_out_for_the_inventory_and_the_defaults():
    # The inventory's job and the defaults fill them in later (driver.api), under these.
    assert arguments.job_from(arguments.build_parser().parse_args(["verify", "-i", "inv"])) == {}
    assert job("--nproc-per-node", "2", "--", "t.py") == {"nproc_per_node": 2, "script": "t.py",
                                                         "args": []}


def test_run_result_document_matches_the_schema(tmp_path):
    result = RunResult("r1", tmp_path, "launch", "failed", Exit.JOB_FAILED, "n1 rank 3: boom",
                       hosts={"n0": {"node_rank": 0, "state": "stopped", "exit_code": -15,
                                     "log": None, "artifacts": []}},
                       timings={"total": 1.5},
                       summary={"world_size": 4, "nproc_per_node": 2, "nnodes": "2",
                                "master": {"host": "n0", "addr": "10.0.0.1", "port": 29500}})
    jsonschema.validate(result.to_dict(), SCHEMA)
    bad = dict(result.to_dict(), exit_code=8)
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


def write_run(runs_dir: Path, run_id: str, nodes: list[str]) -> None:
    (runs_dir / run_id).mkdir(parents=True)
    (runs_dir / run_id / "plan.json").write_text(json.dumps(
        {"started_at": 1.0, "nodes": [{"host": n, "node_rank": i} for i, n in enumerate(nodes)]}))


def test_version(capsys, monkeypatch):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"torchherd {importlib.metadata.version('torchherd')}\n"

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out == "torchherd unknown (a checkout that was never installed)\n"


@pytest.mark.parametrize("argv,action,reason", [
    (["launch", "-i", "inv", "--nproc", "2", "--json", "--", "t.py"], "launch",
     "unrecognized arguments: --nproc"),
    (["launch", "--json", "--", "t.py"], "launch", "the following arguments are required: -i"),
    (["launch", "-i", "inv", "--timeout", "soon", "--json", "--", "t.py"], "launch",
     "argument --timeout: expected an integer, found 'soon'"),
    (["status", "nope", "--runs-dir", "{tmp}", "--json"], "status", "run nope: expected"),
    (["--json"], None, "the following arguments are required: ACTION"),
    (["bogus", "--json"], None, "invalid choice: 'bogus'"),
])
def test_usage_error_with_json_prints_one_document(argv, action, reason, capsys, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert cli.main(argv) == Exit.USAGE
    out = capsys.readouterr().out
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["exit_code"] == 2 and doc["exit_name"] == "usage" and doc["state"] == "invalid"
    assert doc["action"] == action and reason in doc["reason"]


def test_json_after_double_dash_is_the_scripts(capsys):
    assert cli.main(["launch", "--", "t.py", "--json"]) == Exit.USAGE
    out, err = capsys.readouterr()
    assert out == "" and "required: -i/--inventory" in err


def test_runs_dir_from_the_environment(tmp_path, monkeypatch, capsys):
    runs_dir = (tmp_path / "elsewhere").resolve()
    write_run(runs_dir, "r1", ["n0"])
    monkeypatch.setenv(arguments.RUNS_DIR_ENV, str(runs_dir))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["runs", "--json"]) == Exit.OK
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["r1"]
    assert cli.main(["status", "nope"]) == Exit.USAGE
    assert f"expected {runs_dir}/nope/plan.json" in capsys.readouterr().err
    # The flag still wins.
    assert cli.main(["runs", "--json", "--runs-dir", str(tmp_path)]) == Exit.OK
    assert json.loads(capsys.readouterr().out) == {"runs": []}


def test_tables_not_folded_when_piped(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    run_id = "20261123-212706-" + "a" * 40
    nodes = [f"node-{i}.a-long-cluster-domain.example" for i in range(3)]
    write_run(tmp_path, run_id, nodes)
    assert cli.main(["runs", "--runs-dir", str(tmp_path)]) == Exit.OK
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith(run_id) and ",".join(nodes) in line

    result = RunResult(run_id, tmp_path / run_id, "status", "running", Exit.OK, "running",
                       hosts={nodes[0]: {"node_rank": 0, "state": "running", "exit_code": None,
                                         "log": None, "artifacts": []}})
    ui.Ui().report(result, as_json=False)
    err = capsys.readouterr().err
    assert any(nodes[0] in line and "running" in line for line in err.splitlines())
    assert f"run {run_id} running: running" in err


def test_help_shows_defaults_choices_examples_and_exit_codes(capsys):
    def help_of(*argv):
        with pytest.raises(SystemExit) as exc:
            cli.main([*argv, "--help"])
        assert exc.value.code == 0
        return " ".join(capsys.readouterr().out.split())

    launch = help_of("launch")
    assert "--backend {auto,gloo,nccl} Collective backend" in launch
    assert "--firewall {true,false}" in launch
    assert "Rendezvous port on the master, an integer in 1..65535" in launch
    assert "give a number there. (default: 29500)" in launch
    assert "(default: stop)" in launch and "$TORCHHERD_RUNS_DIR" in launch
    assert "examples: torchherd launch -i inventories/cluster.ini" in launch
    # A mapping's own keys, with their types, choices and defaults (not only KEY=VALUE).
    assert "pull (str; missing|always|never; default missing):" in launch
    assert "lock (str): The lock, a path relative to code_src" in launch
    assert "system_site_packages (bool; default False):" in launch
    assert "examples: torchherd logs RUN_ID --follow" in help_of("logs")
    top = help_of()
    for code in Exit:
        assert f"{int(code)} {code.name.lower()} " in top


def test_run_ids_complete_from_the_runs_dir(tmp_path):
    write_run(tmp_path, "20261123-aaa", ["n0"])
    write_run(tmp_path, "20261124-bbb", ["n0"])
    out = tmp_path / "completions"
    line = "torchherd status 20261123"
    env = {**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
           "_ARGCOMPLETE_STDOUT_FILENAME": str(out), arguments.RUNS_DIR_ENV: str(tmp_path)}
    subprocess.run([sys.executable, "-m", "driver"], env=env, check=True, timeout=60)
    assert out.read_text().split("\013") == ["20261123-aaa "]


def test_the_command_leaves_its_objects_to_the_process_end():
    """main has the heap frozen at the interpreter's exit (after the command's last word), so
    that no last garbage collection goes over every object of the run; once, however often
    main runs. A handler registered before main runs after main's (atexit: last in, first
    out) and sees it."""
    code = ("import atexit, gc\n"
            "atexit.register(lambda: print('frozen at exit:', gc.get_freeze_count() > 0))\n"
            "from driver import cli\n"
            "argv = ['launch', '-i', 'inventory.ini', '--check', '--', 'train.py']\n"
            "assert cli.main(argv) == cli.Exit.USAGE == cli.main(argv)\n"
            "print('frozen before exit:', gc.get_freeze_count() > 0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False,
                          cwd=Path(cli.__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-2:] == ["frozen before exit: False",
                                              "frozen at exit: True"], done.stdout
