"""Ctrl-C during preflight on the embedded default (inventories/local.ini): the launch says
that nothing was started (state cancelled, exit code 130), and runs lists it as cancelled."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import jsonschema

from driver.paths import CHECKOUT
from tests.integration.helpers import SCHEMA
from tests.integration.local_nodes import NODE_ROOTS, live_processes_of


def start_launch(tmp_path: Path, run_id: str, *flags: str) -> subprocess.Popen[str]:
    """The CLI's launch of a one-line job on the local nodes, its output piped (not a
    terminal: one plain line per phase on stderr)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "hello.py").write_text("print('hello')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return subprocess.Popen(
        [sys.executable, "-m", "driver", "launch", "-i", "inventories/local.ini",
         "--code-src", str(code), "--name", run_id, "--run-id", run_id,
         "--nproc-per-node", "1", "--runs-dir", str(tmp_path / "runs"), *flags, "--json",
         "--", "hello.py"],
        cwd=CHECKOUT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)


def end_launch(proc: subprocess.Popen[str], run_id: str) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for root in NODE_ROOTS:
        for sub in ("runs", "code"):
            subprocess.run(["rm", "-rf", str(root / sub / run_id)], check=False)


def interrupt_when(proc: subprocess.Popen[str], ready: Callable[[list[str]], bool],
                   missing: str) -> str:
    """Ctrl-C (SIGINT) once the lines read from the launch's stderr so far are `ready`; its
    stdout once it exited 130 after it."""
    seen: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if ready(seen):
            proc.send_signal(signal.SIGINT)
            break
    else:
        raise AssertionError(f"{missing}:\n" + "".join(seen))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, (out + err)[-3000:]
    return out


def test_ctrl_c_in_preflight_reports_nothing_started(tmp_path: Path) -> None:
    runs_dir = tmp_path / "runs"
    run_id = f"cancel-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    proc = start_launch(tmp_path, run_id)
    try:
        # Not a terminal: one plain line per phase; the start is three phases later.
        out = interrupt_when(proc, lambda seen: seen[-1].strip() == "torchherd: preflight",
                             "no preflight phase seen")
        doc = json.loads(out)
        jsonschema.validate(doc, SCHEMA)
        assert doc["state"] == "cancelled" and doc["exit_name"] == "cancelled"
        assert "nothing was started" in doc["reason"] and "stopped" not in doc["reason"]
        assert not any((root / "runs" / run_id / "pid").exists() for root in NODE_ROOTS)
        listed = subprocess.run([sys.executable, "-m", "driver", "runs", "--runs-dir",
                                 str(runs_dir), "--json"], cwd=CHECKOUT, env=env,
                                capture_output=True, text=True, timeout=60, check=True)
        runs = json.loads(listed.stdout)["runs"]
        assert [(r["run_id"], r["state"]) for r in runs] == [(run_id, "cancelled")]
        assert "nothing was started" in runs[0]["reason"]
    finally:
        end_launch(proc, run_id)


def test_ctrl_c_after_preflight_detached_leaves_no_launcher_started_ahead(tmp_path: Path) -> None:
    """--on-interrupt detach with nothing started yet: nothing to leave running, and each node's
    launcher that preflight started ahead is gone when the command returns, not at its
    deadline. The interconnect check between preflight and the start (seconds of torch on each
    node) holds the start back while the cancel comes."""
    (tmp_path / "job.yml").write_text("interconnect: always\n")
    runs_dir = tmp_path / "runs"
    run_id = f"detach-{uuid.uuid4().hex[:8]}"
    proc = start_launch(tmp_path, run_id, "-j", str(tmp_path / "job.yml"),
                        "--on-interrupt", "detach")
    try:
        # Both nodes' facts are in (each started its launcher ahead): cancel.
        out = interrupt_when(
            proc, lambda seen: sum(": checked" in s for s in seen) == len(NODE_ROOTS),
            "no node was checked")
        doc = json.loads(out)
        assert doc["state"] == "cancelled" and "nothing was started" in doc["reason"], doc
        for root in NODE_ROOTS:
            assert live_processes_of(root / "runs" / run_id) == [], \
                f"a process of the run is left on {root.name}"
        schedule = json.loads((runs_dir / run_id / "schedule.json").read_text())
        assert schedule["start"]["warm"], schedule["start"]
    finally:
        end_launch(proc, run_id)
