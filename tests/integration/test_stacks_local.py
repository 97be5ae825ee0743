"""stacks on the embedded default (inventories/local.ini) where py-spy is not installed: the
action fails (exit code 1) naming each node, what it lacks and how to install it, said once for
the nodes that lack the same; the job runs on. Skipped where this machine has py-spy."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from pathlib import Path

import jsonschema
import pytest

from tests.integration.helpers import SCHEMA, torchherd
from tests.integration.local_nodes import NODE_ROOTS

pytestmark = pytest.mark.skipif(
    bool(shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()),
    reason="py-spy is installed here: nothing is missing")


def test_stacks_without_py_spy_fail_and_say_how_to_get_it(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "sleeper.py").write_text("import time\ntime.sleep(120)\n")
    runs_dir = str(tmp_path / "runs")
    run_id = f"stacks-{uuid.uuid4().hex[:8]}"
    try:
        started = torchherd("launch", "-i", "inventories/local.ini", "--code-src", str(code),
                            "--name", run_id, "--run-id", run_id, "--nproc-per-node", "1",
                            "--runs-dir", runs_dir, "--detach", "--", "sleeper.py")
        assert started.returncode == 0, (started.stdout + started.stderr)[-3000:]
        done = torchherd("stacks", run_id, "--runs-dir", runs_dir, "--json")
        assert done.returncode == 1, (done.stdout + done.stderr)[-3000:]
        doc = json.loads(done.stdout)
        jsonschema.validate(doc, SCHEMA)
        assert doc["exit_name"] == "error"
        # Both nodes lack the same: said once, with its fix once.
        assert "node0, node1: py-spy: expected py-spy next to" in doc["reason"], doc["reason"]
        assert doc["reason"].count("-m pip install py-spy") == 1, doc["reason"]
        assert done.stderr.count("-m pip install py-spy") == 1, done.stderr
        text = Path(doc["stacks"]["text"]).read_text()
        assert text.count("-m pip install py-spy") == 1, text
        # Reading stacks changes nothing: the job runs on.
        assert json.loads(torchherd("status", run_id, "--runs-dir", runs_dir,
                                    "--json").stdout)["state"] == "running"
    finally:
        torchherd("stop", run_id, "--runs-dir", runs_dir)
        for root in NODE_ROOTS:
            for sub in ("runs", "code"):
                shutil.rmtree(root / sub / run_id, ignore_errors=True)
