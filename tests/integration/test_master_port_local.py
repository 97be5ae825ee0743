"""The master port on one machine that many users and checkouts share (inventories/local.ini's
nodes): the demo's job takes a port the master picks free at preflight (master_port auto), not
torchrun's 29500 that all of them would meet on; a port the job names is checked as before and
refused while something listens there."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from tests.integration.helpers import torchherd
from tests.integration.local_nodes import LOCAL_INI, NODE_ROOTS


def _listening() -> socket.socket:
    """A listener of someone else on a port of this machine (the kernel's pick)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("0.0.0.0", 0))
    sock.listen(1)
    return sock


def test_the_demo_takes_a_free_master_port_and_records_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with _listening() as busy:
        taken = busy.getsockname()[1]
        # The demo's job as the inventory gives it (master_port auto), as `make demo` runs it.
        done = torchherd("launch", "-i", str(LOCAL_INI), "--runs-dir", str(runs), "--json")
        doc = json.loads(done.stdout)
        assert doc["state"] == "succeeded", done.stderr[-3000:]
        port = doc["master"]["port"]
        assert isinstance(port, int) and port != taken, doc["master"]
        run = runs / doc["run_id"]
        # The plan keeps the job's word; preflight's verdict and the summary the port it picked.
        assert json.loads((run / "plan.json").read_text())["master"]["port"] == "auto"
        assert json.loads((run / "preflight.json").read_text())["gate"]["master_port"] == port
        assert json.loads((run / "summary.json").read_text())["master"]["port"] == port
        # The launcher was started with it, on every node.
        for root in NODE_ROOTS:
            argv = json.loads((root / "runs" / doc["run_id"] / "cmd.json").read_text())
            assert argv[argv.index("--master-port") + 1] == str(port), argv

        # A port the job names is the job's, checked free as before: refused in use.
        refused = torchherd("launch", "-i", str(LOCAL_INI), "--runs-dir", str(runs),
                            "--master-port", str(taken), "--json")
        doc = json.loads(refused.stdout)
        assert doc["exit_name"] == "preflight_failed", refused.stderr[-3000:]
        assert [(p["host"], p["check"]) for p in doc["problems"]] == [("node0", "master port")]
        assert f"port {taken} free on the master" in doc["problems"][0]["expected"]
