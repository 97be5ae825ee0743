"""The run-state record is the one state of a node's run: after every way a run can end, each
file of its run directory states no fact of the run that its record lacks.

Real jobs, started through the supervisor as the start does, in a run directory of their own;
the files are classified below, and a file nobody classified fails the test."""

from __future__ import annotations

import json
import os
import signal
import time
from types import SimpleNamespace

from test_supervisor import ended, params, print_to_fd_1, python

from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.report import report
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.stop import stop
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.wait import wait
from ansible_collections.torchherd.cluster.plugins.module_utils._proc import proc_start_time
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import (
    job_pids,
    read_state,
    recorded_job,
    run_paths,
    supervisor_alive,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    HUNG,
    MARKERS,
    RECORD,
    marker_text,
    read_record,
    rules_open,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor import (
    check_start,
    spawn,
)
from ansible_collections.torchherd.cluster.plugins.modules import firewall_rules

# What meta.json may hold: the run's description as the start gave it, not its course.
DESCRIPTION = {"host", "node_rank", "wrapper", "standby", "container"}
# Files that state no fact of the run: its inputs (argv, environment), its output (the node
# log, the progress file the job touches) and the record's own lock.
NO_FACT = {"cmd.json", "env.json", "node.log", "progress", f".{RECORD}.lock"}
NO_FACT_DIRS = {"torchrun", "flight_recorder"}


def facts_missing(run_dir):
    """What the files of `run_dir` state that its record lacks (empty: nothing)."""
    record = read_record({"dir": run_dir})
    job = record.get("job") or {}
    missing = []
    by_file = {name: field for field, name in MARKERS.items()}
    for name in sorted(os.listdir(run_dir)):
        path = os.path.join(run_dir, name)
        if name == RECORD or name in NO_FACT or name in NO_FACT_DIRS:
            continue
        if name == "restarts":
            for kept in sorted(os.listdir(path)):
                missing += [f"restarts/{kept}/{m}"
                            for m in facts_missing(os.path.join(path, kept))]
        elif name in by_file:
            missing += _marker_missing(name, path, by_file[name], job.get(by_file[name]))
        elif name == "meta.json":
            with open(path, encoding="utf-8") as handle:
                extra = set(json.load(handle)) - DESCRIPTION
            missing += [f"meta.json: {key}" for key in sorted(extra)]
        elif name == HUNG:
            # The declared hang: its time is the record's hang.declared_at (note_hang).
            missing += _marker_missing(name, path, "declared_at",
                                       (record.get("hang") or {}).get("declared_at"))
        elif name == "terminating":
            # The first of several stoppers: a stop or the timeout, which the record holds.
            if job.get("stopped_at") is None and job.get("timed_out_at") is None:
                missing.append("terminating: no stop nor timeout in the record")
        else:
            missing.append(f"{name}: a file nobody classified")
    return missing


def _marker_missing(name, path, field, value):
    with open(path, encoding="utf-8") as handle:
        text = handle.read().strip()
    if value is None:
        return [f"{name}: {text!r}, the record has nothing"]
    said = marker_text(field, value).strip()
    return [] if said == text else [f"{name}: {text!r}, the record says {said!r}"]


def _run(tmp_path, monkeypatch, code, **changes):
    print_to_fd_1(monkeypatch)
    paths = run_paths(str(tmp_path), "r1")
    spawn(params(grace=1, **changes), paths, python(code), {})
    return paths


def _until_running(paths, processes=1):
    deadline = time.monotonic() + 10
    while len(job_pids(paths["dir"])) < processes and time.monotonic() < deadline:
        time.sleep(0.05)


def _ended_with(paths, state, code):
    found = ended(paths)
    assert (found["state"], found["exit_code"]) == (state, code)
    # The record says the end before the supervisor has written the markers it repeats and
    # left: the run is over once the supervisor is gone.
    deadline = time.monotonic() + 10
    while supervisor_alive(paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not supervisor_alive(paths), "the supervisor did not leave"
    assert not facts_missing(paths["dir"]), facts_missing(paths["dir"])
    job = recorded_job(paths["dir"])
    assert job["ended_at"] >= job["started_at"]
    # The module's answer takes its times from the record, as from meta.json before.
    answer = report(paths)
    assert (answer["started_at"], answer["ended_at"]) == (job["started_at"], job["ended_at"])
    assert answer["meta"]["ended_at"] == job["ended_at"]


def test_succeeded(tmp_path, monkeypatch):
    _ended_with(_run(tmp_path, monkeypatch, "print('done')"), "succeeded", 0)


def test_failed(tmp_path, monkeypatch):
    _ended_with(_run(tmp_path, monkeypatch, "raise SystemExit(3)"), "failed", 3)


def test_stopped(tmp_path, monkeypatch):
    paths = _run(tmp_path, monkeypatch, "import time; time.sleep(60)")
    _until_running(paths)
    answer = stop(SimpleNamespace(check_mode=False), params(grace=1), paths)
    assert answer["job_state"] == "stopped"
    _ended_with(paths, "stopped", -15)
    job = recorded_job(paths["dir"])
    assert job["stopped_at"] <= job["ended_at"] and job["killed"] == []


def test_timed_out(tmp_path, monkeypatch):
    paths = _run(tmp_path, monkeypatch, "import time; time.sleep(60)", timeout=1)
    _ended_with(paths, "timed_out", -15)


def test_standby_not_needed(tmp_path, monkeypatch):
    paths = _run(tmp_path, monkeypatch, "raise SystemExit(1)", standby={"delay": 0})
    _ended_with(paths, "standby", 0)
    assert recorded_job(paths["dir"])["standby"] == {"used": False, "launcher_exit": 1}


def test_lost(tmp_path, monkeypatch):
    """The supervisor and the launcher killed without a word (the OOM killer, kill -9)."""
    paths = _run(tmp_path, monkeypatch, "import time; time.sleep(60)")
    _until_running(paths)
    job = recorded_job(paths["dir"])
    for process in (job["supervisor"], job["launcher"]):
        os.kill(process["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while read_state(paths)["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert read_state(paths) == {"state": "lost", "pid": job["pid"], "exit_code": None}
    assert not facts_missing(paths["dir"]), facts_missing(paths["dir"])


def test_restarted(tmp_path, monkeypatch):
    """A whole-job restart keeps the ended run aside (restarts/0) and starts afresh: both
    directories hold no fact their records lack."""
    paths = _run(tmp_path, monkeypatch, "raise SystemExit(3)")
    _ended_with(paths, "failed", 3)
    p = params(grace=1, restart=1)
    check_start(p, paths)
    assert os.path.isdir(os.path.join(paths["dir"], "restarts", "0"))
    spawn(p, paths, python("print('again')"), {})
    _ended_with(paths, "succeeded", 0)
    assert recorded_job(paths["dir"])["restart"] == 1


def test_declared_hung_and_stopped(tmp_path, monkeypatch):
    """The hang watch's word and the declared hang are the record's: the `hung` file that
    job_stacks writes is in the record once a wait saw it, with the activity the wait saw."""
    paths = _run(tmp_path, monkeypatch, "print('step', flush=True); import time; time.sleep(60)")
    _until_running(paths)
    module = SimpleNamespace(check_mode=False)
    p = {"hang": {"timeout": 0.5, "quiet_since": 0.0}, "gang": False, "firewall": None}
    quiet = wait(module, p, paths, 10)
    assert quiet["job_state"] == "running" and quiet["activity"]["quiet"]
    hang = read_record(paths)["hang"]
    assert hang["quiet"] and hang["last"] == quiet["activity"]["last"]
    # Declared hung (as job_stacks' mark_hung writes it): a word the record lacks, until the
    # next wait returns for it.
    with open(paths["hung"], "w", encoding="utf-8") as handle:
        handle.write(f"{time.time()}\n")
    assert facts_missing(paths["dir"])[0].startswith("hung: ")
    p["hang"]["quiet_since"] = hang["last"]
    assert wait(module, p, paths, 10)["activity"]["hung"]
    assert not facts_missing(paths["dir"]), facts_missing(paths["dir"])
    stop(SimpleNamespace(check_mode=False), params(grace=1), paths)
    _ended_with(paths, "stopped", -15)
    assert read_record(paths)["hang"]["declared_at"] is not None


def test_declared_hung_and_stopped_with_no_wait_between(tmp_path, monkeypatch):
    """The node whose wait declared the hang reads the stacks (mark_hung) and stops the job
    at once: the stop writes the declared hang into the record before the job's end."""
    paths = _run(tmp_path, monkeypatch, "import time; time.sleep(60)")
    _until_running(paths)
    with open(paths["hung"], "w", encoding="utf-8") as handle:
        handle.write("1795499931.25\n")
    stop(SimpleNamespace(check_mode=False), params(grace=1), paths)
    _ended_with(paths, "stopped", -15)
    assert read_record(paths)["hang"] == {"declared_at": 1795499931.25}


def test_declared_hung_and_ended_by_the_gang(tmp_path, monkeypatch):
    """The job of a node whose stop came too late (the gang's stop from another node ended
    it first): its supervisor writes the declared hang into the record before the end."""
    paths = _run(tmp_path, monkeypatch, "import time; time.sleep(60)")
    _until_running(paths)
    with open(paths["hung"], "w", encoding="utf-8") as handle:
        handle.write("1795499931.75\n")
    os.kill(recorded_job(paths["dir"])["launcher"]["pid"], signal.SIGTERM)
    _ended_with(paths, "failed", -15)
    assert read_record(paths)["hang"] == {"declared_at": 1795499931.75}


def test_rules_the_firewall_role_opened_and_its_teardown_removed(tmp_path, monkeypatch):
    """The firewall role's module writes what it opened before the start (which finds the run
    directory with the record alone) and what its teardown removed after the end."""
    paths = run_paths(str(tmp_path), "r1")
    rules = ["nft: accept from 10.0.0.2"]
    firewall_rules.note({"state": "present", "run_dir": paths["dir"]},
                        {"changed": True, "rules": rules, "backends": ["nftables"]})
    assert not facts_missing(paths["dir"])
    assert read_state(paths)["state"] == "absent"
    print_to_fd_1(monkeypatch)
    p = params(grace=1)
    check_start(p, paths)
    spawn(p, paths, python("print('done')"), {})
    _ended_with(paths, "succeeded", 0)
    assert rules_open(read_record(paths)) == rules
    firewall_rules.note({"state": "absent", "run_dir": paths["dir"]},
                        {"changed": True, "diff": {"before": rules[0] + "\n", "after": ""}})
    record = read_record(paths)
    assert rules_open(record) == [] and record["firewall"]["removed"] == rules
    assert not facts_missing(paths["dir"]), facts_missing(paths["dir"])


def test_a_file_the_record_lacks_fails(tmp_path, monkeypatch):
    """The check itself: a marker that says more than the record, an end time in meta.json, a
    declared hang the record lacks and a file nobody classified are each named."""
    paths = _run(tmp_path, monkeypatch, "print('done')")
    _ended_with(paths, "succeeded", 0)
    for name, text in (("stopped", "1.0\n"), ("meta.json", '{"ended_at": 1.0}'),
                       ("surprise", ""), ("hung", "2.0\n")):
        with open(os.path.join(paths["dir"], name), "w", encoding="utf-8") as handle:
            handle.write(text)
    assert facts_missing(paths["dir"]) == ["hung: '2.0', the record has nothing",
                                           "meta.json: ended_at",
                                           "stopped: '1.0', the record has nothing",
                                           "surprise: a file nobody classified"]


def _stamp(pid):
    return f"{pid} {proc_start_time(pid)}"


def test_a_run_directory_of_the_previous_version_reads_as_before(tmp_path):
    """Backward compatibility (legacy_job): a run started before an upgrade has its state in
    marker files and its times in meta.json; its record lacks them."""
    paths = run_paths(str(tmp_path), "r1")
    os.makedirs(paths["dir"])
    files = {"pid": _stamp(os.getpid()), "supervisor": _stamp(os.getpid()),
             "meta.json": json.dumps({"host": "n0", "started_at": 10.0}),
             RECORD: json.dumps({"schema": 1, "seq": 2, "job": {"pid": os.getpid(),
                                                                "started_at": 10.0}})}
    for name, text in files.items():
        with open(os.path.join(paths["dir"], name), "w", encoding="utf-8") as handle:
            handle.write(text)
    assert read_state(paths) == {"state": "running", "pid": os.getpid(), "exit_code": None}
    for name, text in (("stopped", "11.0\n"), ("exit_code", "-15\n")):
        with open(os.path.join(paths["dir"], name), "w", encoding="utf-8") as handle:
            handle.write(text)
    assert read_state(paths) == {"state": "stopped", "pid": os.getpid(), "exit_code": -15}
    job = recorded_job(paths["dir"])
    assert (job["started_at"], job["stopped_at"]) == (10.0, 11.0)
    # No end time written: the exit code file's, as the module answered before.
    assert job["ended_at"] == os.path.getmtime(paths["exit_code"])
    answer = report(paths)
    assert (answer["job_state"], answer["started_at"], answer["meta"]["host"]) == (
        "stopped", 10.0, "n0")
