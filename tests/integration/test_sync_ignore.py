"""A real launch on the embedded default (inventories/local.ini: two nodes on this machine, no
cluster) of a code directory whose .gitignore lists data/: nothing of data/ reaches either
node's code directory, and the job runs."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from tests.integration.helpers import torchherd
from tests.integration.local_nodes import NODE_ROOTS

# Runs on every node, in its code directory: the job itself fails where data/ came along.
CHECK = """\
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(f"data/ was synced to {here}" if os.path.exists(os.path.join(here, "data")) else 0)
"""


def test_gitignored_data_stays_on_the_controller(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "data").mkdir(parents=True)
    (code / ".gitignore").write_text("data/\n")
    (code / "data" / "shard-0.bin").write_bytes(os.urandom(4 << 20))
    (code / "check.py").write_text(CHECK)
    run_id = f"sync-ignore-{uuid.uuid4().hex[:8]}"
    code_dirs = [root / "code" / run_id for root in NODE_ROOTS]
    try:
        proc = torchherd("launch", "-i", "inventories/local.ini", "--code-src", str(code),
                         "--name", run_id, "--run-id", run_id, "--nproc-per-node", "1",
                         "--runs-dir", str(tmp_path / "runs"), "--json", "--", "check.py")
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        result = json.loads(proc.stdout)
        assert result["state"] == "succeeded", proc.stdout[-3000:]
        # The launch says what it sent: two small files per node, none of the 4 MiB.
        assert result["sync"]["files"] == 2 * len(code_dirs), result["sync"]
        assert 0 < result["sync"]["bytes"] < 64 << 10, result["sync"]
        assert {h["sync"]["files"] for h in result["hosts"].values()} == {2}
        for code_dir in code_dirs:
            assert sorted(p.name for p in code_dir.iterdir()) == [".gitignore", "check.py"]
        plan = json.loads((tmp_path / "runs" / run_id / "plan.json").read_text())
        assert plan["code_files"] == 2
    finally:
        for code_dir in code_dirs:
            shutil.rmtree(code_dir, ignore_errors=True)
