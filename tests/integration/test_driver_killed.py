"""A driver ended by a signal leaves nothing behind: killed outright (SIGKILL: the OOM killer,
kill -9, a CI runner's hard timeout) no ansible-playbook, and a later command tells the job's
state and stops it; a closed terminal (SIGHUP) settles a launch as Ctrl-C does; SIGTERM ends
`logs --follow` with its ansible-playbook and private directory. On the embedded default
(inventories/local.ini: two nodes on this machine)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from tests.integration.helpers import EXAMPLES, REPO, wait_for
from tests.integration.local_nodes import LOCAL_INI, NODE_ROOTS, live_processes_of


class Launch(NamedTuple):
    process: subprocess.Popen[bytes]
    tmp: Path
    runs: Path
    run_id: str
    node_runs: list[Path]


def playbooks_of(tmp: Path) -> list[int]:
    """ansible-playbook processes (and their workers) of the driver whose TMPDIR is `tmp`: their
    command line (python -c <the driver's _PLAYBOOK> <pid> playbook ...) names its private
    directory there."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and b"playbook" in argv and any(str(tmp).encode() in a for a in argv):
            found.append(int(entry.name))
    return found


def driver(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "driver", *args], cwd=REPO,
                          env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True,
                          text=True, timeout=300, check=False)


def start(tmp: Path, runs: Path, run_id: str, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "driver", "launch", "-i", str(LOCAL_INI), "--code-src",
         str(EXAMPLES), "--runs-dir", str(runs), "--run-id", run_id, "--nproc-per-node", "1",
         *extra, "--", "allreduce.py", "--sleep", "300"],
        cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def watched_launch(tmp_path: Path, name: str) -> Iterator[Launch]:
    """A launch of a long job on both nodes, once it runs there (its record is written by its
    start: the launcher started ahead in preflight is a process of the run before that) and the
    watch's wait is in flight: ansible-playbook and a worker of it waiting on a node. Killed, and
    its job stopped, on the way out if the test left it running."""
    runs, tmp, run_id = tmp_path / "runs", tmp_path / "tmp", f"{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    launch = Launch(start(tmp, runs, run_id), tmp, runs, run_id,
                    [root / "runs" / run_id for root in NODE_ROOTS])
    try:
        wait_for(lambda: all((d / "run.json").exists() and live_processes_of(d)
                             for d in launch.node_runs), 180, "the job on both nodes")
        wait_for(lambda: len(playbooks_of(tmp)) >= 2, 60, "the watch's wait")
        yield launch
    finally:
        if launch.process.poll() is None:
            launch.process.kill()
            driver("stop", run_id, "--runs-dir", str(runs), "-i", str(LOCAL_INI), tmp=tmp)


def test_a_driver_killed_outright_takes_its_ansible_playbook_with_it(tmp_path):
    with watched_launch(tmp_path, "killed") as launch:
        tmp, runs, run_id, node_runs = launch.tmp, launch.runs, launch.run_id, launch.node_runs
        try:
            # A driver killed then left ansible-playbook and its worker running for minutes.
            launch.process.send_signal(signal.SIGKILL)
            launch.process.wait(30)
            wait_for(lambda: not playbooks_of(tmp), 15, "the launch's ansible-playbook to end")

            # The job itself goes on; status says so, and stop ends it everywhere.
            status = driver("status", run_id, "--runs-dir", str(runs), "--json", tmp=tmp)
            assert json.loads(status.stdout)["state"] == "running", status.stdout + status.stderr
            assert all(live_processes_of(d) for d in node_runs)
        finally:
            stopped = driver("stop", run_id, "--runs-dir", str(runs), "-i", str(LOCAL_INI),
                             "--json", tmp=tmp)
    assert json.loads(stopped.stdout)["state"] == "stopped", stopped.stdout + stopped.stderr
    wait_for(lambda: not any(live_processes_of(d) for d in node_runs), 30, "nothing left")
    assert not playbooks_of(tmp)


def test_a_closed_terminal_stops_the_launch_as_ctrl_c_does(tmp_path):
    with watched_launch(tmp_path, "hup") as launch:
        tmp, runs, run_id, node_runs = launch.tmp, launch.runs, launch.run_id, launch.node_runs
        launch.process.send_signal(signal.SIGHUP)
        assert launch.process.wait(120) == 130
    summary = json.loads((runs / run_id / "summary.json").read_text())
    assert {h["state"] for h in summary["hosts"].values()} == {"stopped"}, summary["hosts"]
    assert not any(live_processes_of(d) for d in node_runs)
    assert not playbooks_of(tmp) and not list(tmp.iterdir()), list(tmp.iterdir())


def test_sigterm_ends_logs_follow_with_nothing_left(tmp_path):
    runs, tmp, run_id = tmp_path / "runs", tmp_path / "tmp", f"term-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    assert start(tmp, runs, run_id, "--detach").wait(180) == 0
    try:
        follow = subprocess.Popen(
            [sys.executable, "-m", "driver", "logs", run_id, "--follow", "--interval", "1",
             "--runs-dir", str(runs), "-i", str(LOCAL_INI)],
            cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL)
        assert follow.stdout is not None
        assert follow.stdout.readline().startswith(b"node")  # it follows the nodes' logs
        wait_for(lambda: playbooks_of(tmp), 60, "a fetch of the logs in flight")
        follow.send_signal(signal.SIGTERM)
        assert follow.wait(30) == 130
        follow.stdout.close()
        wait_for(lambda: not playbooks_of(tmp), 15, "the fetch's ansible-playbook to end")
        assert not list(tmp.iterdir()), list(tmp.iterdir())
    finally:
        stopped = driver("stop", run_id, "--runs-dir", str(runs), "-i", str(LOCAL_INI),
                         "--json", tmp=tmp)
    assert json.loads(stopped.stdout)["state"] == "stopped", stopped.stdout + stopped.stderr
