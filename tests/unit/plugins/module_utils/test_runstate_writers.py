"""The run-state record's writers beyond the job's own: the marker files before the record
(note_job), the hang watch's word (note_hang, the wait), the firewall role's rules written as
root into the job user's run directory (firewall_rules with run_dir), and a whole-job restart's
fresh record (carry_over)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from types import SimpleNamespace

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

from ansible_collections.torchherd.cluster.plugins.filter.run_state import run_state
from ansible_collections.torchherd.cluster.plugins.module_utils import _runstate
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.wait import _activity
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import run_paths
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    MARKERS,
    carry_over,
    marker_text,
    note_hang,
    note_job,
    read_record,
    rules_open,
    write,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.checks import (
    keep_ended_run,
)
from ansible_collections.torchherd.cluster.plugins.modules import firewall_rules

RULES = ["nftables inet filter input: ip saddr { 10.0.0.2 } meta l4proto tcp accept"]


def test_the_markers_are_in_place_before_the_record_says_their_facts(tmp_path, monkeypatch):
    """A reader that finds the job's end in the record and then reads the marker that repeats
    it (the root cause reads `stopped`) must find the marker: note_job writes markers first."""
    paths = {"dir": str(tmp_path)}
    seen = []
    real = _runstate.write

    def write_seeing_markers(paths_, section, **fields):
        seen.append({name: os.path.exists(os.path.join(paths_["dir"], MARKERS[f]))
                     for f, name in ((f, MARKERS[f]) for f in fields if f in MARKERS)})
        return real(paths_, section, **fields)

    monkeypatch.setattr(_runstate, "write", write_seeing_markers)
    note_job(paths, stopped_at=5.0, exit_code=-15, ended_at=6.0)
    assert seen == [{"stopped": True, "exit_code": True}]
    job = read_record(paths)["job"]
    for field in ("stopped_at", "exit_code"):
        with open(os.path.join(str(tmp_path), MARKERS[field]), encoding="utf-8") as handle:
            assert handle.read() == marker_text(field, job[field])


def test_the_hang_watch_notes_its_word_and_the_declared_hang(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    os.makedirs(paths["dir"])
    with open(paths["log"], "w", encoding="utf-8") as handle:
        handle.write("step 1\n")
    quiet = time.time() - 30
    os.utime(paths["log"], (quiet, quiet))
    module = SimpleNamespace(check_mode=False)
    activity = _activity(module, paths, {"timeout": 10.0, "quiet_since": 0.0})
    # The answer keeps its shape; the record has the same word and more.
    assert activity == {"last": quiet, "quiet": True, "hung": False}
    hang = read_record(paths)["hang"]
    assert hang["last"] == quiet and hang["quiet"] and hang["quiet_for"] >= 30
    assert hang["timeout"] == 10.0 and hang["quiet_since"] is None and "declared_at" not in hang
    # job_stacks declares the hang with the `hung` file: the next word carries its time.
    with open(paths["hung"], "w", encoding="utf-8") as handle:
        handle.write("1795499931.5\n")
    assert _activity(module, paths, {"timeout": 10.0, "quiet_since": quiet})["hung"]
    hang = read_record(paths)["hang"]
    assert hang["declared_at"] == 1795499931.5 and hang["quiet_since"] == quiet
    # In check mode, or with no run directory here, nothing is written.
    seq = read_record(paths)["seq"]
    _activity(SimpleNamespace(check_mode=True), paths, {"timeout": 10.0, "quiet_since": 0.0})
    assert read_record(paths)["seq"] == seq
    gone = run_paths(str(tmp_path), "r2")
    assert _activity(module, gone, {"timeout": 1.0, "quiet_since": 0.0})["last"] is None
    assert not os.path.exists(gone["dir"])


def test_note_hang_writes_the_hung_file_it_repeats_first(tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    note_hang(paths, declared_at=12.5)
    with open(paths["hung"], encoding="utf-8") as handle:
        assert handle.read() == "12.5\n"
    assert read_record(paths)["hang"] == {"declared_at": 12.5}


@pytest.fixture
def users_run_dir():
    """A run directory that another user (nobody) owns, as the job's user owns its own while
    the firewall module writes it as root; only where the tests run as root."""
    if os.geteuid() != 0:
        pytest.skip("needs root: writes as root into another user's directory")
    home = tempfile.mkdtemp(prefix="torchherd-home-")
    os.chmod(home, 0o755)
    os.chown(home, 65534, 65534)
    yield home
    shutil.rmtree(home)


def _as_nobody(fn):
    """fn() in a child process as user nobody; its exit status (0: fn returned)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            fn()
            os._exit(0)
        except BaseException:  # pylint: disable=broad-except  # the status says it
            os._exit(1)
    return os.waitpid(pid, 0)[1]


def test_root_writes_the_users_run_directory_as_the_user(users_run_dir):
    """The firewall role's module runs as root before the start: the run directory it makes,
    the record and its lock are the user's, and the user's own writers go on."""
    paths = run_paths(os.path.join(users_run_dir, ".torchherd"), "r1")
    write(paths, "firewall", **_runstate.rules_opened("role", {"rules": RULES}))
    for path in (os.path.dirname(os.path.dirname(paths["dir"])),
                 os.path.dirname(paths["dir"]), paths["dir"],
                 _runstate.record_path(paths), os.path.join(paths["dir"], ".run.json.lock")):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (65534, 65534), path
    assert _as_nobody(lambda: note_job(paths, started_at=1.0, exit_code=0)) == 0
    record = read_record(paths)
    assert record["job"] == {"started_at": 1.0, "exit_code": 0} and record["seq"] == 2
    assert rules_open(record) == RULES
    # Root writes after the user: the files stay the user's.
    note_job(paths, ended_at=2.0)
    assert os.stat(paths["exit_code"]).st_uid == 65534
    assert os.stat(_runstate.record_path(paths)).st_uid == 65534


def test_root_follows_no_link_the_user_left(users_run_dir, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    runs = os.path.join(users_run_dir, "runs")
    os.mkdir(runs)
    os.chown(runs, 65534, 65534)
    os.symlink(str(target), os.path.join(runs, "r1"))
    with pytest.raises(OSError, match="symbolic link"):
        write({"dir": os.path.join(runs, "r1")}, "firewall", opened_by="role")
    assert list(target.iterdir()) == []


class Ended(Exception):
    pass


@pytest.fixture
def firewall_module(monkeypatch):
    """firewall_rules.main with the rules code replaced by `converged` (what it returns) or
    an error; its result."""
    monkeypatch.setattr(AnsibleModule, "exit_json", lambda _self, **r: (_ for _ in ()).throw(
        Ended(dict(r, failed=False))))
    monkeypatch.setattr(AnsibleModule, "fail_json", lambda _self, **r: (_ for _ in ()).throw(
        Ended(dict(r, failed=True))))

    def run(converged, **args):
        def converge(_runner, _p):
            if isinstance(converged, Exception):
                raise converged
            return dict(converged)
        monkeypatch.setattr(firewall_rules, "converge_rules", converge)
        with patch_module_args(dict({"run_id": "r1"}, **args)), pytest.raises(Ended) as ended:
            firewall_rules.main()
        return ended.value.args[0]
    return run


def _diff(before, after):
    return {"before": "".join(f"{line}\n" for line in before),
            "after": "".join(f"{line}\n" for line in after)}


def test_the_firewall_module_writes_what_it_opened_and_removed(firewall_module, tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    opened = {"changed": True, "rules": RULES, "backends": ["nftables"], "msg": ""}
    result = firewall_module(opened, peers=["10.0.0.2"], run_dir=paths["dir"])
    fw = read_record(paths)["firewall"]
    assert fw == {"opened_by": "role", "rules": RULES, "backends": ["nftables"],
                  "closed_by": None, "changed": None, "error": None}
    assert result["record"] == read_record(paths) and rules_open(result["record"]) == RULES
    # A teardown that fails keeps them open, with its error.
    failed = firewall_rules.FirewallError("nft: busy")
    result = firewall_module(failed, state="absent", run_dir=paths["dir"])
    assert result["failed"] and result["msg"] == "nft: busy"
    assert read_record(paths)["firewall"]["error"] == "nft: busy"
    assert rules_open(read_record(paths)) == RULES
    removed = {"changed": True, "rules": [], "backends": ["nftables"], "msg": "",
               "diff": _diff(RULES, [])}
    result = firewall_module(removed, state="absent", run_dir=paths["dir"])
    fw = read_record(paths)["firewall"]
    assert (fw["closed_by"], fw["changed"], fw["error"], fw["removed"]) == (
        "teardown", True, None, RULES)
    assert rules_open(result["record"]) == []
    # A second teardown finds nothing and leaves the record as it is.
    seq = read_record(paths)["seq"]
    nothing = dict(removed, changed=False, diff=_diff([], []))
    assert "record" not in firewall_module(nothing, state="absent", run_dir=paths["dir"])
    assert read_record(paths)["seq"] == seq
    # Opened again (the next launch of the run id): the earlier removal no longer holds.
    firewall_module(opened, peers=["10.0.0.2"], run_dir=paths["dir"])
    assert rules_open(read_record(paths)) == RULES


def test_the_firewall_module_makes_no_directory_for_a_removal_nor_writes_in_check_mode(
        firewall_module, tmp_path):
    paths = run_paths(str(tmp_path), "r1")
    removed = {"changed": True, "rules": [], "diff": _diff(RULES, [])}
    assert "record" not in firewall_module(removed, state="absent", run_dir=paths["dir"])
    assert not os.path.exists(paths["dir"])
    opened = {"changed": True, "rules": RULES}
    assert "record" not in firewall_module(opened, run_dir=paths["dir"], _ansible_check_mode=True)
    assert "record" not in firewall_module(opened)
    assert not os.path.exists(paths["dir"])


def test_run_state_reads_the_roles_rules_from_the_record():
    """Where the record says what the role opened, the record alone counts (the role's result
    included the rules, the teardown's record says they went)."""
    role = {"seq": 1, "firewall": {"opened_by": "role", "rules": RULES, "closed_by": None,
                                   "error": None}}
    torn = {"seq": 9, "firewall": dict(role["firewall"], closed_by="teardown", changed=True)}
    hostvars = {
        # The role's copy, then the start's and the watch's, which carry its section.
        "a": {"torchherd_firewall": {"changed": True, "rules": RULES, "record": role},
              "torchherd_start": {"started": True, "record": dict(role, seq=4)}},
        # The record says the rules went (a teardown before, written into the record): the
        # role's result alone would still name them.
        "b": {"torchherd_firewall": {"changed": True, "rules": RULES, "record": role},
              "torchherd_watch": {"job_state": "succeeded", "record": torn}},
        # No record written by the role (no run_dir): its result, as before.
        "c": {"torchherd_firewall": {"changed": True, "rules": RULES},
              "torchherd_start": {"started": True}},
        # The role opened nothing (no firewall active): nothing to tear down.
        "d": {"torchherd_firewall": {"changed": False, "rules": [],
                                     "record": {"seq": 1, "firewall": {"opened_by": "role",
                                                                       "rules": []}}}},
    }
    states = run_state(list(hostvars), hostvars)
    assert {h: s["rules_open"] for h, s in states.items()} == {
        "a": RULES, "b": [], "c": RULES, "d": []}
    assert states["a"]["record"]["seq"] == 4 and not any(s["lost"] for s in states.values())
    # The role's unreachable host is not a node lost while its job ran.
    states = run_state(["e"], {"e": {"torchherd_firewall": {"unreachable": True}}})
    assert not states["e"]["lost"]


def test_a_restart_keeps_the_rules_still_open_and_counts_on(tmp_path):
    """The firewall role writes the ended run's record before the start keeps it aside: the
    fresh record keeps the rules it opened, and its seq goes on from the kept one's, so that
    the role's copy on the controller is not taken for newer."""
    paths = run_paths(str(tmp_path), "r1")
    note_job(paths, started_at=1.0, supervisor={"pid": 1, "start": "0"},
             launcher={"pid": 1, "start": "0"}, pid=1, exit_code=3, ended_at=2.0)
    role = write(paths, "firewall", **_runstate.rules_opened("role", {"rules": RULES}))
    assert keep_ended_run({"restart": 1}, paths, "failed")
    fresh = read_record(paths)
    assert fresh["seq"] == role["seq"] + 1 and fresh["job"] == {}
    assert rules_open(fresh) == RULES
    kept = read_record({"dir": os.path.join(paths["dir"], "restarts", "0")})
    assert kept["job"]["exit_code"] == 3
    # Rules already removed are not carried: the fresh record starts without them.
    write(paths, "firewall", closed_by="supervisor", error=None)
    note_job(paths, started_at=3.0, supervisor={"pid": 1, "start": "0"},
             launcher={"pid": 1, "start": "0"}, pid=1, exit_code=0, ended_at=4.0)
    assert keep_ended_run({"restart": 2}, paths, "succeeded")
    assert read_record(paths)["firewall"] == {}
    assert read_record(paths)["seq"] > fresh["seq"]


def test_carry_over_of_a_record_with_nothing_open(tmp_path):
    paths = {"dir": str(tmp_path / "r")}
    assert carry_over(paths, {"seq": 7, "firewall": {}}) == dict(
        _runstate.empty(), seq=8, updated_at=read_record(paths)["updated_at"])
