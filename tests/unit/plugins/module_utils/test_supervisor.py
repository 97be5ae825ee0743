"""torchrun's command line and environment, and the detached supervisor and the stop over real
processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    MARKER,
    job_pids,
    read_state,
    run_paths,
    supervisor_alive,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import read_record
from ansible_collections.torchherd.cluster.plugins.module_utils._stop import stop
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor import (
    StartError,
    check_start,
    first_output,
    job_env,
    launcher_argv,
    spawn,
)

# The torchrun_job module's parameters with their defaults, as AnsibleModule hands them over.
DEFAULTS = {
    "run_id": "r1", "python": "", "script": "train.py", "args": [], "chdir": None,
    "nnodes": "1", "nproc_per_node": 1, "node_nprocs": [], "node_rank": 0,
    "master_addr": "127.0.0.1",
    "master_port": 29500, "rdzv": "static", "max_restarts": 0, "rdzv_conf": {}, "env": {},
    "secret_env": {}, "timeout": 0, "grace": 10, "meta": {}, "wrapper": [],
    "launcher": "torchrun", "launcher_args": [], "use_cpu": False, "torch_version": "",
}


def params(**changes):
    return dict(DEFAULTS, **changes)


def test_static_rendezvous_passes_this_nodes_rank_and_the_master():
    paths = run_paths("/srv/th", "r1")
    argv = launcher_argv(params(python="/opt/venv/bin/python", nnodes="2", nproc_per_node=4,
                                node_rank=1, master_addr="10.0.0.1", master_port=29400),
                         paths)
    assert argv == [
        "/opt/venv/bin/python", "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", "4", "--max-restarts", "0",
        "--log-dir", "/srv/th/runs/r1/torchrun", "--redirects", "3", "--tee", "3",
        "--node-rank", "1", "--master-addr", "10.0.0.1", "--master-port", "29400",
        "train.py"]


def test_c10d_rendezvous_names_the_endpoint_and_run_with_sorted_settings():
    argv = launcher_argv(params(nnodes="2:4", rdzv="c10d", max_restarts=3,
                                rdzv_conf={"timeout": 60, "join_timeout": 30},
                                master_addr="node0", master_port=29501),
                         run_paths("/srv/th", "r1"))
    assert argv[0] == sys.executable
    assert argv[argv.index("--nnodes") + 1] == "2:4"
    assert argv[argv.index("--max-restarts") + 1] == "3"
    assert argv[argv.index("--rdzv-backend"):] == [
        "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29501", "--rdzv-id", "r1",
        "--rdzv-conf", "join_timeout=30,timeout=60", "train.py"]
    assert "--node-rank" not in argv and "--master-addr" not in argv


def test_c10d_without_settings_has_no_rdzv_conf():
    argv = launcher_argv(params(rdzv="c10d"), run_paths("/srv/th", "r1"))
    assert "--rdzv-conf" not in argv


def test_a_wrapper_comes_first_and_script_args_stay_a_list_untouched():
    args = ["--name", "two words", "$HOME; rm -rf /", "'quoted'", "a|b"]
    argv = launcher_argv(params(wrapper=["srun", "--jobid=42", "--overlap"], args=args),
                         run_paths("/srv/th", "r1"))
    assert argv[:4] == ["srun", "--jobid=42", "--overlap", sys.executable]
    assert argv[-6:] == ["train.py", *args]


def test_numbers_become_strings():
    argv = launcher_argv(params(nproc_per_node=8, max_restarts=2), run_paths("/srv/th", "r1"))
    assert all(isinstance(arg, str) for arg in argv)
    assert argv[argv.index("--nproc-per-node") + 1] == "8"


def test_accelerate_gets_the_plans_machine_rank_and_total_process_count():
    paths = run_paths("/srv/th", "r1")
    argv = launcher_argv(params(launcher="accelerate", nnodes="3", nproc_per_node=2, node_rank=1,
                                master_addr="10.0.0.1", master_port=29511,
                                launcher_args=["--config_file", "acc.yaml"], args=["--x"]),
                         paths)
    assert argv[1:4] == ["-m", "accelerate.commands.launch", "--multi_gpu"]
    assert argv[argv.index("--num_machines") + 1] == "3"
    assert argv[argv.index("--machine_rank") + 1] == "1"
    assert argv[argv.index("--num_processes") + 1] == "6"  # every node's processes
    assert argv[argv.index("--main_process_ip") + 1] == "10.0.0.1"
    assert argv[argv.index("--main_process_port") + 1] == "29511"
    assert "--same_network" in argv  # static rendezvous with this node's rank
    assert argv[argv.index("--log_dir") + 1] == paths["torchrun_logs"]
    # The user's launcher options come after the plan's, before the script and its args.
    assert argv[-4:] == ["--config_file", "acc.yaml", "train.py", "--x"]


def test_accelerate_on_a_node_without_gpus_is_switched_to_cpu():
    env, shown = job_env(params(launcher="accelerate", use_cpu=True), "/d", {})
    assert env["ACCELERATE_USE_CPU"] == "1" and shown["ACCELERATE_USE_CPU"] == "1"
    env, _shown = job_env(params(launcher="accelerate", use_cpu=False), "/d", {})
    assert "ACCELERATE_USE_CPU" not in env
    env, _shown = job_env(params(launcher="torchrun", use_cpu=True), "/d", {})
    assert "ACCELERATE_USE_CPU" not in env


def test_deepspeed_gets_its_per_node_launcher_with_the_world_of_the_plan():
    import base64

    argv = launcher_argv(params(launcher="deepspeed", nnodes="2", nproc_per_node=3, node_rank=1,
                                master_addr="10.0.0.1", master_port=29512),
                         run_paths("/srv/th", "r1"))
    assert argv[1:4] == ["-u", "-m", "deepspeed.launcher.launch"]
    info = next(a for a in argv if a.startswith("--world_info="))
    world = json.loads(base64.urlsafe_b64decode(info.split("=", 1)[1]))
    assert world == {"node0": [0, 1, 2], "node1": [0, 1, 2]}
    assert "--node_rank=1" in argv and "--master_addr=10.0.0.1" in argv
    assert "--master_port=29512" in argv and argv[-1] == "train.py"


def test_deepspeed_world_with_nodes_of_other_process_counts():
    import base64

    argv = launcher_argv(params(launcher="deepspeed", nnodes="3", nproc_per_node=2, node_rank=1,
                                node_nprocs=[1, 2, 3]), run_paths("/srv/th", "r1"))
    info = next(a for a in argv if a.startswith("--world_info="))
    world = json.loads(base64.urlsafe_b64decode(info.split("=", 1)[1]))
    assert world == {"node0": [0], "node1": [0, 1], "node2": [0, 1, 2]}


def test_the_job_environment_drops_ansible_and_redacts_secrets_in_what_is_shown():
    base = {"PATH": "/usr/bin", "ANSIBLE_MODULE_ARGS": "{}", "ANSIBLE_ASYNC_DIR": "/x"}
    env, shown = job_env(params(env={"OMP_NUM_THREADS": 2}, secret_env={"WANDB_API_KEY": "s3"}),
                         "/srv/th/runs/r1", base)
    assert not [key for key in env if key.startswith("ANSIBLE_")]
    assert env["PATH"] == "/usr/bin" and env["OMP_NUM_THREADS"] == "2"
    assert env["WANDB_API_KEY"] == "s3"
    assert env[MARKER] == "/srv/th/runs/r1" and env["TORCHHERD_RUN_ID"] == "r1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env  # static rendezvous
    assert shown == {"OMP_NUM_THREADS": "2", "WANDB_API_KEY": "********"}
    assert base == {"PATH": "/usr/bin", "ANSIBLE_MODULE_ARGS": "{}", "ANSIBLE_ASYNC_DIR": "/x"}


def test_c10d_gets_an_unshared_store_unless_env_sets_it():
    env, _shown = job_env(params(rdzv="c10d"), "/d", {})
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    env, _shown = job_env(params(rdzv="c10d", env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"}),
                          "/d", {})
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"


def test_a_run_id_starts_once_and_needs_a_script_and_its_wrapper(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    with pytest.raises(StartError, match="script is required"):
        check_start(params(script=None), paths)
    with pytest.raises(StartError, match="expected no-such-srun on this node's PATH"):
        check_start(params(wrapper=["no-such-srun"]), paths)
    check_start(params(wrapper=[sys.executable]), paths)
    os.makedirs(paths["dir"])
    with open(paths["pid"], "w", encoding="utf-8") as handle:
        handle.write(f"{os.getpid()} 1")
    with open(paths["exit_code"], "w", encoding="utf-8") as handle:
        handle.write("0\n")
    with pytest.raises(StartError, match="already exists") as raised:
        check_start(params(), paths)
    assert raised.value.result == {"job_state": "succeeded", "run_dir": paths["dir"]}


def ended(paths, seconds=20):
    deadline = time.monotonic() + seconds
    while read_state(paths)["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    return read_state(paths)


def python(code):
    return [sys.executable, "-c", code]


def test_the_supervisor_runs_the_job_detached_and_writes_the_run_directory(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    # As a launcher without per-rank log files (DeepSpeed's): its output in the node log is the
    # job's first output.
    p = params(env={"GREETING": "hello"}, secret_env={"TOKEN": "s3cr3t"},
               meta={"host": "node0"}, chdir=str(tmp_path), launcher="deepspeed")
    show = ("import os; print(os.environ['GREETING'], os.environ['TOKEN'], "
            f"os.environ['{MARKER}'], os.getcwd()); raise SystemExit(3)")
    started_at = spawn(p, paths, python(show), {"PATH": os.environ["PATH"]})
    state = ended(paths)
    assert (state["state"], state["exit_code"]) == ("failed", 3)
    assert log_text(paths).split() == ["hello", "s3cr3t", paths["dir"], str(tmp_path)]
    with open(paths["env"], encoding="utf-8") as handle:
        written = handle.read()
    assert "s3cr3t" not in written
    assert json.loads(written) == {"GREETING": "hello", "TOKEN": "********"}
    with open(paths["cmd"], encoding="utf-8") as handle:
        assert json.load(handle) == python(show)
    with open(paths["meta"], encoding="utf-8") as handle:
        meta = json.load(handle)
    # meta.json describes the run; its times are the record's.
    job = read_record(paths)["job"]
    assert meta == {"host": "node0"} and job["started_at"] == started_at
    assert job["ended_at"] >= started_at
    assert started_at <= job["first_output_at"] <= job["ended_at"]


def test_apptainer_gets_the_jobs_variables_as_its_own_copies_and_never_the_secret(tmp_path):
    # The launcher here stands in for apptainer's exec: it shows the environment the runtime
    # would start from (apptainer puts APPTAINERENV_<name> into the container as <name>).
    paths = run_paths(str(tmp_path), "r1")
    image = {"runtime": "apptainer", "path": "/usr/bin/apptainer", "image": "train.sif",
             "id": str(tmp_path / "train.sif"), "gpus": False, "volumes": [], "options": []}
    p = params(env={"GREETING": "hello"}, secret_env={"TOKEN": "s3cr3t"}, chdir=str(tmp_path),
               container=image, launcher="deepspeed", restart=0)
    show = "import json, os; print(json.dumps(dict(os.environ)))"
    spawn(p, paths, python(show), {"PATH": os.environ["PATH"], "NCCL_DEBUG": "WARN"})
    assert ended(paths)["exit_code"] == 0
    env = json.loads(log_text(paths).strip().splitlines()[-1])
    assert env["APPTAINERENV_GREETING"] == "hello" and env["APPTAINERENV_NCCL_DEBUG"] == "WARN"
    assert env[f"APPTAINERENV_{MARKER}"] == paths["dir"] == env[MARKER]
    assert "TOKEN" not in env and "APPTAINERENV_TOKEN" not in env
    assert "APPTAINERENV_PATH" not in env  # the image's own PATH, not the node's
    assert "s3cr3t" not in json.dumps(env)


def test_the_first_output_is_the_first_byte_a_rank_wrote_not_the_launchers_chatter(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    rank_dir = Path(paths["torchrun_logs"]) / "none_x" / "attempt_0" / "0"
    rank_dir.mkdir(parents=True)
    (rank_dir / "stdout.log").write_text("")  # the launcher made the file; the rank said nothing
    Path(paths["log"]).write_text("W1125 torchrun: OMP_NUM_THREADS set to 1\n")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        watcher = threading.Thread(target=first_output, args=(proc, paths, paths["torchrun_logs"],
                                                              0, 0.01))
        watcher.start()
        time.sleep(0.2)
        assert "first_output_at" not in read_record(paths)["job"]
        said_at = time.time()
        (rank_dir / "stdout.log").write_text("step 0\n")
        watcher.join(5)
        assert not watcher.is_alive()
        assert said_at <= read_record(paths)["job"]["first_output_at"] <= time.time()
    finally:
        proc.kill()
        proc.wait()


def test_without_rank_files_the_node_logs_growth_is_the_first_output(tmp_path):
    """DeepSpeed's launcher writes no per-rank files; a job that never speaks records none."""
    paths = run_paths(str(tmp_path), "r1")
    os.makedirs(paths["dir"], exist_ok=True)
    Path(paths["log"]).write_text("torchherd: an earlier line\n")
    before = os.path.getsize(paths["log"])
    silent = subprocess.Popen([sys.executable, "-c", "pass"])
    silent.wait()
    first_output(silent, paths, None, before, 0.01)
    assert "first_output_at" not in read_record(paths)["job"]
    speaking = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with open(paths["log"], "a", encoding="utf-8") as log:
            log.write("[rank0]: hello\n")
        first_output(speaking, paths, None, before, 0.01)
        assert read_record(paths)["job"]["first_output_at"] > 0
    finally:
        speaking.kill()
        speaking.wait()


def test_the_supervisor_removes_the_starts_rules_before_the_exit_code(tmp_path, monkeypatch):
    """The rules the start opened go once the job ends, with the firewall's own code, before
    the exit code says so; an error there is written down and the exit code still comes."""
    from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor import firewall

    print_to_fd_1(monkeypatch)
    seen = tmp_path / "seen"
    rules = {"peers": ["10.0.0.2"], "mode": "members", "ports": [], "backend": "none",
             "persistent": False}

    def close_rules(runner, run_id, options):
        # What the supervisor passes, and that the job had ended and its code was not out yet.
        seen.write_text(json.dumps([run_id, options, os.path.exists(paths["exit_code"])]))
        return {"changed": True, "rules": [], "backends": ["nftables"]}

    monkeypatch.setattr(firewall, "close_rules", close_rules)
    paths = run_paths(str(tmp_path), "r1")
    spawn(params(), paths, python("raise SystemExit(0)"), {}, close=rules)
    assert ended(paths)["exit_code"] == 0
    assert json.loads(seen.read_text()) == ["r1", rules, False]
    fw = read_record(paths)["firewall"]
    assert (fw["closed_by"], fw["changed"], fw["error"]) == ("supervisor", True, None)
    # The record says the job's end, too (the same moment as the exit code).
    assert read_record(paths)["job"]["exit_code"] == 0

    def broken(runner, run_id, options):
        raise RuntimeError("no nft here")

    monkeypatch.setattr(firewall, "close_rules", broken)
    paths = run_paths(str(tmp_path), "r2")
    spawn(params(run_id="r2"), paths, python("raise SystemExit(4)"), {}, close=rules)
    assert ended(paths)["exit_code"] == 4
    fw = read_record(paths)["firewall"]
    assert (fw["closed_by"], fw["error"]) == ("supervisor", "RuntimeError: no nft here")
    assert "could not be removed here: RuntimeError: no nft here" in log_text(paths)


def print_to_fd_1(monkeypatch):
    """The supervisor prints to the node log on fd 1, as under Ansible, not to pytest's capture
    (whose file it closes); set in the test itself, since pytest sets its own after fixtures."""
    monkeypatch.setattr(sys, "stdout", sys.__stdout__)


def started(paths, code, processes):
    """Starts `code` as the job and waits until it said ready (its signal handlers are set)
    with that many processes; the launcher's pid."""
    spawn(params(), paths, python(code), {})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (
            "ready" in log_text(paths) and len(job_pids(paths["dir"])) >= processes):
        time.sleep(0.05)
    return read_state(paths)["pid"]


def on_sigterm(handler, setup=""):
    """A job's code: `setup`, then `handler` set for SIGTERM, "ready" said, a minute's wait."""
    return (f"import os, signal, subprocess, sys, time\n{setup}"
            f"signal.signal(signal.SIGTERM, {handler})\nos.write(1, b'ready\\n')\ntime.sleep(60)\n")


def log_text(paths):
    with open(paths["log"], encoding="utf-8") as handle:
        return handle.read()


def test_the_supervisor_stops_a_job_past_its_timeout(tmp_path, monkeypatch):
    print_to_fd_1(monkeypatch)
    paths = run_paths(str(tmp_path), "r1")
    spawn(params(timeout=1, grace=2), paths, python("import time; time.sleep(60)"), {})
    state = ended(paths)
    assert state["state"] == "timed_out" and state["exit_code"] == -15
    assert "job timed out after 1 s" in log_text(paths)
    assert not job_pids(paths["dir"])


def test_a_command_that_cannot_start_fails_with_127_and_says_why(tmp_path, monkeypatch):
    print_to_fd_1(monkeypatch)
    paths = run_paths(str(tmp_path), "r1")
    spawn(params(), paths, [str(tmp_path / "no-such-python")], {})
    state = ended(paths)
    assert (state["state"], state["exit_code"]) == ("failed", 127)
    assert "cannot start torchrun" in log_text(paths)


def test_stop_leaves_no_process_of_the_job(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    # A worker that ignores SIGTERM in a session of its own, as torchrun's workers are.
    deaf = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    stubborn = (deaf + "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                f"'{deaf}time.sleep(60)'], start_new_session=True); time.sleep(60)")
    spawn(params(), paths, python(stubborn), {})
    deadline = time.monotonic() + 10
    while len(job_pids(paths["dir"])) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = read_state(paths)["pid"]
    killed = stop(paths, pid, 0.5)
    assert len(killed) == 2
    assert not job_pids(paths["dir"])
    assert ended(paths)["state"] == "stopped"


def test_nccl_jobs_keep_a_flight_recorder_the_users_settings_win():
    env, shown = job_env(params(env={"TORCHHERD_BACKEND": "nccl"}), "/srv/th/runs/r1", {})
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/srv/th/runs/r1/flight_recorder/pipe_"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/srv/th/runs/r1/flight_recorder/rank_"
    assert shown["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    env, _shown = job_env(params(env={"TORCHHERD_BACKEND": "nccl",
                                      "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}), "/d", {})
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "0"
    env, _shown = job_env(params(env={"TORCHHERD_BACKEND": "gloo"}), "/d", {})
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env
    assert env["TORCHHERD_PROGRESS_FILE"] == "/d/progress"


@pytest.mark.parametrize("version, name, other", [
    ("2.10.1+cu128", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"),
    ("", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"),  # unknown: every torch reads it
    ("2.11.0+cu130", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    ("2.13.0a0+git1234", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    ("3.0.0", "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
])
def test_the_flight_recorder_is_sized_under_the_name_the_jobs_torch_reads(version, name, other):
    """torch 2.11 and later warn on every NCCL process group where the old name is set, even
    beside the new one: only one of them is set, by the node's torch version."""
    env, shown = job_env(params(env={"TORCHHERD_BACKEND": "nccl"}, torch_version=version),
                         "/d", {})
    assert env[name] == shown[name] == "2000"
    assert other not in env
    # The user's size under either name wins: torch would prefer ours under the new name.
    for users in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"):
        env, _shown = job_env(params(env={"TORCHHERD_BACKEND": "nccl", users: "0"},
                                     torch_version=version), "/d", {})
        assert env[users] == "0" and [k for k in env if k.endswith("BUFFER_SIZE")] == [users]


def background(port, listen, expect=2, window=30):
    # Bounds, not waits: a node that comes meets at once; on starved cores (the suite beside
    # the cluster tests) a supervisor can take seconds to start and to answer.
    return {"listen": listen, "expect": expect, "timeout": 10, "window": window, "source": "",
            "background": True}


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_in_the_background(tmp_path, port, host, code):
    """Starts `code` as the job of node `host` (a: the master) of a two-node run whose barrier
    waits in its supervisors; the node's paths."""
    paths = run_paths(str(tmp_path / host), "r1")
    spawn(params(barrier=background(port, host == "a"), meta={"host": host},
                 master_addr="127.0.0.1", master_port=port), paths, python(code), {})
    return paths


def test_in_the_background_the_nodes_meet_and_one_failure_stops_the_others(tmp_path):
    port = free_port()
    master = start_in_the_background(tmp_path, port, "a", "import time; time.sleep(60)")
    # The start returned while the master waits at the barrier: the job counts as running.
    assert read_state(master)["state"] == "running"
    node = start_in_the_background(tmp_path, port, "b",
                                   "import sys, time; time.sleep(1); sys.exit(3)")
    failed = ended(node)
    assert (failed["state"], failed["exit_code"]) == ("failed", 3)
    # The master heard it from b's supervisor and stopped its own job: no controller.
    stopped = ended(master, 30)
    assert stopped["state"] == "stopped", stopped
    assert "stopping: b ended with exit code 3" in Path(master["log"]).read_text()
    for paths in (master, node):
        seen = read_record(paths)["barrier"]
        assert seen["go"] and seen["where"] == "supervisors"
        assert not job_pids(paths["dir"])


def test_a_failed_worker_stops_the_others_before_its_launcher_ends(tmp_path):
    port = free_port()
    master = start_in_the_background(tmp_path, port, "a", "import time; time.sleep(60)")
    # b's launcher does not look at its worker for a minute (as torchrun on starved cores):
    # the worker's exit code is read from its zombie, and the others stop at once. A child of
    # the launcher that is no rank (no LOCAL_RANK) fails first, and counts for nothing.
    slow = ("import os, subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import sys; sys.exit(5)']); "
            "subprocess.Popen([sys.executable, '-c', 'import sys, time; time.sleep(1.5); "
            "sys.exit(3)'], env=dict(os.environ, LOCAL_RANK='0')); time.sleep(60)")
    began = time.monotonic()
    node = start_in_the_background(tmp_path, port, "b", slow)
    stopped = ended(master, 20)
    assert stopped["state"] == "stopped", stopped
    assert "stopping: b ended with exit code 3" in Path(master["log"]).read_text()
    failed = ended(node, 20)
    took = time.monotonic() - began
    # b itself: failed with its worker's code, its launcher ended 2 s after the worker.
    assert (failed["state"], failed["exit_code"]) == ("failed", 3)
    assert "ended with exit code 3: the other nodes are told to stop" in log_text(node)
    assert took < 15, took
    for paths in (master, node):
        assert not job_pids(paths["dir"])


def test_after_a_barrier_in_the_start_call_the_supervisors_form_the_gang(tmp_path):
    from ansible_collections.torchherd.cluster.plugins.module_utils._probe import bind
    master = run_paths(str(tmp_path / "a"), "r1")
    node = run_paths(str(tmp_path / "b"), "r1")
    sock, _error = bind(0)
    port = sock.getsockname()[1]
    common = {"master_addr": "127.0.0.1", "master_port": free_port()}
    inline = dict(background(0, True), background=False)
    # The master's socket passes to its supervisor; the node joins with the port the go named.
    spawn(params(barrier=inline, meta={"host": "a"}, **common), master,
          python("import time; time.sleep(60)"), {}, gang={"sock": sock})
    assert sock.fileno() == -1  # closed here: the supervisor's now
    spawn(params(barrier=dict(inline, listen=False), meta={"host": "b"}, **common), node,
          python("import sys, time; time.sleep(1); sys.exit(3)"), {}, gang={"port": port})
    assert (ended(node)["state"], ended(node)["exit_code"]) == ("failed", 3)
    stopped = ended(master, 10)
    # Every other node joined: the master's gang spoke for them all, and lost none (its record,
    # final once the master's supervisor is gone, which the wait waits for).
    deadline = time.monotonic() + 10
    while supervisor_alive(master) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_record(master)["gang"] == {"joined": 1, "expected": 1, "lost": []}
    assert read_record(node)["gang"] == {}
    assert stopped["state"] == "stopped", stopped
    assert "stopping: b ended with exit code 3" in Path(master["log"]).read_text()
    for paths in (master, node):
        assert not job_pids(paths["dir"])


def test_in_the_background_a_node_that_never_comes_calls_the_start_off(tmp_path):
    port = free_port()
    master = run_paths(str(tmp_path / "a"), "r1")
    spawn(params(barrier=background(port, True, window=1), master_addr="127.0.0.1",
                 master_port=port), master, python("print('started')"), {})
    called_off = ended(master)
    assert called_off["state"] == "failed"
    log = Path(master["log"]).read_text()
    assert "the start was called off" in log and "started" not in log


def test_a_launcher_whose_workers_ended_gets_two_seconds_not_the_grace(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    # A launcher that stays after SIGTERM (as torchrun can, signalled in its own shutdown),
    # and its worker, which the test ends.
    start_worker = ("subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
                    "start_new_session=True)\n")
    pid = started(paths, on_sigterm("signal.SIG_IGN", start_worker), 2)
    # The worker is in a session of its own: the launcher's group SIGTERM misses it, so end it.
    worker = next(p for p in job_pids(paths["dir"]) if p != pid)
    os.kill(worker, signal.SIGTERM)
    began = time.monotonic()
    killed = stop(paths, pid, 30)
    took = time.monotonic() - began
    assert killed == [pid]
    assert 1.5 < took < 6, took
    assert ended(paths)["state"] == "stopped"


def test_a_second_stopper_sends_no_second_sigterm(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    # Counts the SIGTERMs it gets in the node log, and ends on the second.
    counter = ("n = [0]\ndef on(*_):\n    n[0] += 1\n    os.write(1, b'term %d\\n' % n[0])\n"
               "    if n[0] > 1: os._exit(9)\n")
    pid = started(paths, on_sigterm("on", counter), 1)
    stoppers = [threading.Thread(target=stop, args=(paths, pid, 1)) for _ in range(2)]
    for thread in stoppers:
        thread.start()
    for thread in stoppers:
        thread.join()
    assert log_text(paths).count("term ") == 1
    assert not job_pids(paths["dir"])


def test_a_standby_that_never_started_workers_ends_as_standby_not_failed(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    # As torchrun that waited in the rendezvous and lost its store: no attempt directory.
    spawn(params(standby={"delay": 0.3}), paths, python("raise SystemExit(1)"), {})
    state = ended(paths)
    assert (state["state"], state["exit_code"]) == ("standby", 0)
    assert read_record(paths)["job"]["standby"] == {"used": False, "launcher_exit": 1}
    assert "standby: the launcher starts in 0.3 s" in log_text(paths)
    assert "standby: not needed" in log_text(paths)


def test_a_node_of_such_a_job_that_started_workers_ends_as_any_other(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    # As torchrun whose workers ran (it made their attempt directory) and failed.
    made = ("import os, sys; os.makedirs(os.path.join(sys.argv[1], 'r1_x', 'attempt_1', '0')); "
            "raise SystemExit(1)")
    spawn(params(standby={"delay": 0}), paths, python(made) + [paths["torchrun_logs"]], {})
    state = ended(paths)
    assert (state["state"], state["exit_code"]) == ("failed", 1)
    assert read_record(paths)["job"]["standby"] == {"used": True, "launcher_exit": 1}


def test_without_the_standby_option_an_error_without_workers_is_a_failure(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    spawn(params(), paths, python("raise SystemExit(1)"), {})
    assert ended(paths)["state"] == "failed"
    assert "standby" not in read_record(paths)["job"]


def test_a_standby_stopped_during_its_delay_never_starts(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    marker = tmp_path / "ran"
    spawn(params(standby={"delay": 30}), paths,
          python(f"open({str(marker)!r}, 'w').close()"), {})
    stop(paths, None, 1)
    state = ended(paths)
    assert state["state"] == "stopped" and not marker.exists()


def test_where_torchrun_restarts_each_attempts_start_and_first_output_are_recorded(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    logs = Path(paths["torchrun_logs"]) / "r1_x"
    os.makedirs(paths["dir"])
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])

    def attempts_when(done):
        deadline = time.monotonic() + 10
        while not done(read_record(paths)["job"].get("attempts") or {}):
            assert time.monotonic() < deadline, read_record(paths)["job"]
            time.sleep(0.02)
        return read_record(paths)["job"]["attempts"]

    try:
        rank = logs / "attempt_0" / "0"
        rank.mkdir(parents=True)
        (rank / "stdout.log").write_text("")  # made empty at the attempt's start
        watch = threading.Thread(target=first_output, daemon=True, args=(
            proc, paths, paths["torchrun_logs"], 0), kwargs={"attempts": True,
                                                            "attempt_interval": 0.05})
        watch.start()
        # A silent attempt is seen starting before anything is said.
        assert attempts_when(lambda a: "0" in a)["0"]["output_at"] is None
        (rank / "stdout.log").write_text("epoch 0\n")
        first = attempts_when(lambda a: a["0"]["output_at"])["0"]
        assert first["output_at"] == read_record(paths)["job"]["first_output_at"]
        restarted = time.time()
        (logs / "attempt_1" / "0").mkdir(parents=True)
        again = attempts_when(lambda a: "1" in a)["1"]
        assert again["started_at"] >= restarted and again["output_at"] is None
        (logs / "attempt_1" / "0" / "stdout.log").write_text("resumed\n")
        assert attempts_when(lambda a: a["1"]["output_at"])["1"]["output_at"] >= restarted
    finally:
        proc.kill()
        proc.wait()
    watch.join(5)
    assert not watch.is_alive()
