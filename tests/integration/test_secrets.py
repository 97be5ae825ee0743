"""No secret value at any verbosity, on both entry points (inventories/local.ini: two nodes on
this machine, no cluster).

A job with a secret_env value that is a unique random string runs once through
`ansible-playbook -vvvv` with a result-recording callback (callback/record_results.py, as ARA
or AWX would record) and once through `python -m driver launch -vvv --secret-env NAME`. The
value must show nowhere: not in the output, the recorded results and task arguments, the run
directory on the controller or the nodes' torchherd roots. The job itself checks that it got
the value (it prints only "secret ok"), and each node's env.json names the secret: it came
through secret_env, not from an environment the local nodes inherit from the controller.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from driver.paths import CHECKOUT
from tests.integration.local_nodes import LOCAL_INI, NODE_ROOTS, node_roots

NAME = "TORCHHERD_TEST_SECRET"
CHECK = """\
import hashlib
import os
import sys

# The job proves it got the secret by its hash: the value itself is printed nowhere.
value = os.environ.get({name!r}, "")
if hashlib.sha256(value.encode()).hexdigest() != {digest!r}:
    sys.exit("secret missing or wrong")
print("secret ok")
"""


def _job(tmp_path: Path, secret: str) -> tuple[Path, str]:
    """A code directory whose script checks the secret, and a fresh run id (the local nodes
    keep their run directories)."""
    code = tmp_path / "code"
    code.mkdir()
    digest = hashlib.sha256(secret.encode()).hexdigest()
    (code / "check_secret.py").write_text(CHECK.format(name=NAME, digest=digest))
    return code, f"secrets-{uuid.uuid4().hex[:12]}"


def _env(**extra: str) -> dict[str, str]:
    """This environment without the caller's Ansible settings nor the secret's name."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != NAME}
    env.update(ANSIBLE_CONFIG=str(CHECKOUT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", **extra)
    return env


def _files(*roots: Path) -> Iterator[Path]:
    for root in roots:
        paths = sorted(root.rglob("*")) if root.is_dir() else [root]
        yield from (p for p in paths if p.is_file() and not p.is_symlink())


def _assert_nowhere(secret: str, outputs: dict[str, str], *roots: Path) -> None:
    found = [name for name, text in outputs.items() if secret in text]
    needle = secret.encode()
    for path in _files(*roots):
        try:
            if needle in path.read_bytes():
                found.append(str(path))
        except FileNotFoundError:  # another run's file, removed while we looked
            continue
    assert not found, f"the secret value shows in: {', '.join(found)}"


def _assert_delivered(runs_dir: Path, run_id: str, roots: list[Path] | None = None) -> None:
    summary = json.loads((runs_dir / run_id / "summary.json").read_text())
    assert summary["state"] == "succeeded", summary
    plan = json.loads((runs_dir / run_id / "plan.json").read_text())
    assert plan["job"]["secret_env"] == {NAME: "********"}
    for root in roots or NODE_ROOTS:
        shown = json.loads((root / "runs" / run_id / "env.json").read_text())
        assert shown[NAME] == "********", shown
        assert "secret ok" in (root / "runs" / run_id / "node.log").read_text()


@dataclass
class PlaybookRun:
    secret: str
    procs: list[subprocess.CompletedProcess[str]]  # the launch's and its relaunch's
    runs_dir: Path
    run_ids: list[str]
    record: Path  # results and task arguments as written
    record_args: Path  # task arguments as templated for the run


@pytest.fixture(scope="module")
def playbook_run(tmp_path_factory: pytest.TempPathFactory) -> PlaybookRun:
    """A launch through `ansible-playbook -vvvv` with the recording callback, and its relaunch,
    whose starts come with the facts calls (the secret then travels in node_facts' call)."""
    tmp_path = tmp_path_factory.mktemp("secrets-playbook")
    secret = f"th-{uuid.uuid4().hex}"
    code, first = _job(tmp_path, secret)
    runs_dir = tmp_path / "runs"
    record, record_args = tmp_path / "record.jsonl", tmp_path / "record-args.jsonl"
    env = _env(ANSIBLE_CALLBACKS_ENABLED="record_results",
               ANSIBLE_CALLBACK_PLUGINS=str(Path(__file__).parent / "callback"),
               TORCHHERD_TEST_RECORD=str(record), TORCHHERD_TEST_RECORD_ARGS=str(record_args))
    (tmp_path / "input").mkdir()
    procs, run_ids = [], [first, f"{first}-again"]
    for run_id in run_ids:
        job = tmp_path / "input" / f"{run_id}.yml"
        job.write_text(json.dumps({"torchherd_job": {
            "script": "check_secret.py", "code_src": str(code), "nproc_per_node": 1,
            "runs_dir": str(runs_dir), "run_id": run_id, "secret_env": {NAME: secret}}}))
        procs.append(subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), "-vvvv",
             "playbooks/launch.yml", "-i", str(LOCAL_INI), "-e", f"@{job}"],
            cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=300, check=False))
    return PlaybookRun(secret, procs, runs_dir, run_ids, record, record_args)


def test_playbook_at_vvvv_with_a_recording_callback_shows_no_secret(
        playbook_run: PlaybookRun) -> None:
    run = playbook_run
    for proc in run.procs:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    recorded = [json.loads(line) for line in run.record.read_text().splitlines()]
    assert {"localhost", "node0", "node1"} <= {r.get("host") for r in recorded}, "no results"
    for run_id in run.run_ids:
        _assert_delivered(run.runs_dir, run_id)
    # The relaunch's starts came with its facts calls, the secret with them.
    schedule = json.loads((run.runs_dir / run.run_ids[1] / "schedule.json").read_text())
    assert schedule["start"]["with_facts"], schedule["why"]["with_facts"]
    _assert_nowhere(run.secret, {f"{name} {i}": getattr(proc, name)
                                 for i, proc in enumerate(run.procs)
                                 for name in ("stdout", "stderr")},
                    run.record, run.runs_dir, *NODE_ROOTS)


def test_templated_task_arguments_hold_no_secret(playbook_run: PlaybookRun) -> None:
    assert all(proc.returncode == 0 for proc in playbook_run.procs)
    _assert_nowhere(playbook_run.secret, {}, playbook_run.record_args)


class Poller:
    """Reads every file under its roots, over and over from a thread, while a run goes on: a
    file that holds a needle even for a moment is a sighting. A file is read again when its
    size, mtime or inode changed since its last read (and at least every half second)."""

    def __init__(self, needles: dict[str, str], *roots: Path) -> None:
        self.needles = {what: value.encode() for what, value in needles.items()}
        self.roots = roots
        self.sightings: set[tuple[str, str]] = set()
        self.rounds = 0
        self._seen: dict[Path, tuple[int, int, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _look(self) -> None:
        fresh = int(time.monotonic() * 2)
        for root in self.roots:
            for dirpath, _, names in os.walk(root):
                for name in names:
                    path = Path(dirpath) / name
                    try:
                        st = path.lstat()
                        if not stat.S_ISREG(st.st_mode):
                            continue  # a pipe is read by its own reader alone
                        key = (st.st_size, st.st_mtime_ns, st.st_ino, fresh)
                        if self._seen.get(path) == key:
                            continue
                        data = path.read_bytes()
                    except OSError:  # gone while we looked
                        continue
                    self._seen[path] = key
                    for what, needle in self.needles.items():
                        if needle in data:
                            self.sightings.add((what, str(path)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._look()
            self.rounds += 1
            time.sleep(0.01)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self._look()


@dataclass
class PolledRuns:
    secret: str
    run_id: str
    runs_dir: Path
    home: Path
    tmp: Path
    procs: dict[str, subprocess.CompletedProcess[str]]  # the launch's and the verify's
    poller: Poller


@pytest.fixture(scope="module")
def polled_runs(tmp_path_factory: pytest.TempPathFactory) -> PolledRuns:
    """A launch and a verify through `python -m driver ... -vvv --secret-env NAME`, with HOME
    (the nodes' roots are under it), TMPDIR and the runs directory of their own, read by a
    poller from start to end. Two tests read them: the output, and the files at every
    moment."""
    tmp_path = tmp_path_factory.mktemp("secrets-driver")
    secret, token = f"th-{uuid.uuid4().hex}", f"tok-{uuid.uuid4().hex}"
    code, run_id = _job(tmp_path, secret)
    runs_dir, home, tmp = tmp_path / "runs", tmp_path / "home", tmp_path / "tmp"
    for path in (runs_dir, home, tmp):
        path.mkdir()
    env = _env(**{NAME: secret, "TORCHHERD_TEST_TOKEN": token, "HOME": str(home),
                  "TMPDIR": str(tmp)})
    common = ["-vvv", "-i", str(LOCAL_INI), "--code-src", str(code), "--runs-dir",
              str(runs_dir), "--nproc-per-node", "1", "--secret-env", NAME]
    procs = {}
    with Poller({"the secret": secret, "the driver's environment": token},
                tmp, home, runs_dir) as poller:  # the nodes' roots are under home
        for action, extra in (("launch", ["--run-id", run_id]),
                              ("verify", ["--run-id", f"{run_id}-verify"])):
            procs[action] = subprocess.run(
                [sys.executable, "-m", "driver", action, *common, *extra, "--",
                 "check_secret.py"], cwd=CHECKOUT, env=env, capture_output=True, text=True,
                timeout=300, check=False)
    return PolledRuns(secret, run_id, runs_dir, home, tmp, procs, poller)


def test_driver_at_vvv_shows_no_secret(polled_runs: PolledRuns) -> None:
    runs = polled_runs
    for action, proc in runs.procs.items():
        assert proc.returncode == 0, (action, (proc.stdout + proc.stderr)[-3000:])
    _assert_delivered(runs.runs_dir, runs.run_id, node_roots(runs.home))
    outputs = {f"{action}'s {stream}": getattr(proc, stream)
               for action, proc in runs.procs.items() for stream in ("stdout", "stderr")}
    # The driver's private ansible-runner directories (the extra vars file) are under TMPDIR.
    _assert_nowhere(runs.secret, outputs, runs.runs_dir, *node_roots(runs.home), runs.tmp)


def test_no_secret_nor_the_drivers_environment_is_on_disk_at_any_moment(
        polled_runs: PolledRuns) -> None:
    """The launch and the verify above, read by a poller from start to end: the secret's value
    and a variable of the driver's own environment are in no file under TMPDIR, HOME, the runs
    directory or the nodes' roots at any moment (ansible-runner's private directory among them:
    the extra vars and its record of the environment pass through pipes)."""
    runs = polled_runs
    for action, proc in runs.procs.items():
        assert proc.returncode == 0, (action, (proc.stdout + proc.stderr)[-3000:])
    _assert_delivered(runs.runs_dir, runs.run_id, node_roots(runs.home))
    assert runs.poller.rounds > 10, runs.poller.rounds
    assert not runs.poller.sightings, sorted(runs.poller.sightings)
    assert not list(runs.tmp.glob("torchherd-runner-*")), "a private directory was left behind"
