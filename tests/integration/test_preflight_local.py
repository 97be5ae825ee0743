"""Preflight on the embedded default's nodes (inventories/local.ini: two nodes on this machine,
no cluster) where a node's Python for Ansible's modules is missing: the verdict names the node,
the interpreter and the inventory line to fix, not Ansible's "Module result deserialization
failed"."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.integration.helpers import torchherd
from tests.integration.local_nodes import LOCAL_INI


def test_a_node_whose_module_python_is_missing_is_named_with_its_fix(tmp_path: Path) -> None:
    # local.ini's nodes without its job (verify checks the nodes alone), node1's Python gone.
    inventory = tmp_path / "nodes.ini"
    inventory.write_text("".join(
        f"{line} ansible_python_interpreter=/nonexistent/python\n" if line.startswith("node1 ")
        else f"{line}\n" for line in LOCAL_INI.read_text().splitlines()
        if not line.startswith("torchherd_job=")))
    done = torchherd("verify", "-i", str(inventory), "--python", sys.executable,
                     "--runs-dir", str(tmp_path / "runs"), "--json")
    doc = json.loads(done.stdout)
    assert doc["exit_name"] == "preflight_failed", done.stderr[-3000:]
    problems = [p for p in doc["problems"] if p["host"] == "node1"]
    assert [p["check"] for p in problems] == ["ansible python"], problems
    found = problems[0]
    assert found["found"].startswith("/nonexistent/python: "), found
    assert "not found" in found["found"]
    assert f"set ansible_python_interpreter for node1 in {inventory}" in found["fix"]
    assert not [p for p in doc["problems"] if p["host"] == "node0"]
    assert "ansible python" in done.stderr and "deserialization" not in done.stderr
