"""A driver killed outright (SIGKILL: the OOM killer, kill -9, a CI runner's hard timeout)
leaves no ansible-playbook behind, and a later command tells the job's state and stops it. On
the embedded default (inventories/local.ini: two nodes on this machine)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from tests.integration.helpers import EXAMPLES, REPO, wait_for
from tests.integration.local_nodes import LOCAL_INI, NODE_ROOTS, live_processes_of


def playbooks_of(tmp: Path) -> list[int]:
    """ansible-playbook processes (and their workers) of the driver whose TMPDIR is `tmp`: their
    command line names its private directory there."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if (state != "Z" and any(a.endswith(b"ansible-playbook") for a in argv)
                and any(str(tmp).encode() in a for a in argv)):
            found.append(int(entry.name))
    return found


def driver(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "driver", *args], cwd=REPO,
                          env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True,
                          text=True, timeout=300, check=False)


def test_a_driver_killed_outright_takes_its_ansible_playbook_with_it(tmp_path):
    runs, tmp, run_id = tmp_path / "runs", tmp_path / "tmp", f"killed-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    launch = subprocess.Popen(
        [sys.executable, "-m", "driver", "launch", "-i", str(LOCAL_INI), "--code-src",
         str(EXAMPLES), "--runs-dir", str(runs), "--run-id", run_id, "--nproc-per-node", "1",
         "--", "allreduce.py", "--sleep", "300"],
        cwd=REPO, env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    node_runs = [root / "runs" / run_id for root in NODE_ROOTS]
    try:
        # The job runs on both nodes and the driver watches it.
        wait_for(lambda: all((d / "run.json").exists() and live_processes_of(d)
                             for d in node_runs), 180, "the job on both nodes")
        # The watch's wait in flight: ansible-playbook and a worker of it that waits on a node
        # (a driver killed then left both running for minutes, the worker spinning).
        wait_for(lambda: len(playbooks_of(tmp)) >= 2, 60, "the watch's wait")
        launch.send_signal(signal.SIGKILL)
        launch.wait(30)
        wait_for(lambda: not playbooks_of(tmp), 15, "the launch's ansible-playbook to end")

        # The job itself goes on; status says so, and stop ends it everywhere.
        status = driver("status", run_id, "--runs-dir", str(runs), "--json", tmp=tmp)
        assert json.loads(status.stdout)["state"] == "running", status.stdout + status.stderr
        assert all(live_processes_of(d) for d in node_runs)
    finally:
        if launch.poll() is None:
            launch.kill()
        stopped = driver("stop", run_id, "--runs-dir", str(runs), "-i", str(LOCAL_INI),
                         "--json", tmp=tmp)
    assert json.loads(stopped.stdout)["state"] == "stopped", stopped.stdout + stopped.stderr
    wait_for(lambda: not any(live_processes_of(d) for d in node_runs), 30, "nothing left")
    assert not playbooks_of(tmp)
