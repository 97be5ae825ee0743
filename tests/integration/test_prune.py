"""runs --prune on the embedded default (inventories/local.ini: two nodes on this machine, each
with its own torchherd_root): two real launches, then a prune that keeps the newest one removes
the older run's directory on the controller and on both nodes, and leaves the newer's."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import jsonschema

from tests.integration.helpers import SCHEMA, torchherd
from tests.integration.local_nodes import NODE_ROOTS


def test_prune_keeps_the_newest_run_on_the_controller_and_the_nodes(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "hello.py").write_text("print('hello')\n")
    runs_dir = tmp_path / "runs"
    name = f"prune-{uuid.uuid4().hex[:8]}"
    older, newer = f"{name}-1", f"{name}-2"
    try:
        for run_id in (older, newer):
            done = torchherd("launch", "-i", "inventories/local.ini", "--code-src", str(code),
                             "--name", name, "--run-id", run_id, "--nproc-per-node", "1",
                             "--runs-dir", str(runs_dir), "--", "hello.py")
            assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        for run_id in (older, newer):
            assert (runs_dir / run_id).is_dir()
            assert all((root / "runs" / run_id / "node.log").is_file() for root in NODE_ROOTS)

        # An older run of another inventory (its nodes are not in local.ini): it stays, and
        # says which inventory prunes it, without failing the prune.
        other = f"{name}-0"
        shutil.copytree(runs_dir / older, runs_dir / other)
        plan = json.loads((runs_dir / other / "plan.json").read_text())
        for node in plan["nodes"]:
            node["host"] = f"elsewhere-{node['host']}"
        (runs_dir / other / "plan.json").write_text(json.dumps(plan))
        (runs_dir / other / "driver.json").write_text(json.dumps({"inventory": "/x/other.ini"}))

        prune = ("runs", "--prune", "--keep", "1", "-i", "inventories/local.ini",
                 "--runs-dir", str(runs_dir), "--json")
        # A dry run (the default) says what would go, with the nodes' sizes, and removes nothing.
        dry = torchherd(*prune)
        assert dry.returncode == 0, (dry.stdout + dry.stderr)[-3000:]
        doc = json.loads(dry.stdout)
        jsonschema.validate(doc, SCHEMA)
        assert doc["dry_run"] and doc["nodes_asked"]
        runs = {r["run_id"]: r for r in doc["runs"]}
        assert sorted(runs) == sorted([older, other])
        assert runs[older]["removed"] and not runs[other]["removed"]
        assert runs[other]["kept"] == ("its nodes elsewhere-node0, elsewhere-node1 are not in "
                                       "this inventory: prune it with -i /x/other.ini")
        assert {h: n["removed"] for h, n in runs[older]["nodes"].items()} == \
            {"node0": True, "node1": True}
        assert doc["totals"]["node_dirs"] == 2 and doc["totals"]["node_bytes"] > 0
        assert (runs_dir / older).is_dir()
        assert all((root / "runs" / older).is_dir() for root in NODE_ROOTS)

        done = torchherd(*prune, "--yes")
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        doc = json.loads(done.stdout)
        jsonschema.validate(doc, SCHEMA)
        assert not doc["dry_run"] and doc["totals"]["runs"] == 1
        assert doc["totals"]["bytes"] > 0 and doc["totals"]["node_bytes"] > 0
        assert not (runs_dir / older).exists()
        assert not any((root / "runs" / older).exists() for root in NODE_ROOTS)
        assert (runs_dir / newer / "plan.json").is_file()
        assert all((root / "runs" / newer / "node.log").is_file() for root in NODE_ROOTS)
        # The code directory is every run's of this name: pruning a run leaves it.
        assert all((root / "code" / name / "hello.py").is_file() for root in NODE_ROOTS)
        listed = torchherd("runs", "--runs-dir", str(runs_dir), "--json")
        assert sorted(r["run_id"] for r in json.loads(listed.stdout)["runs"]) == \
            sorted([other, newer])
    finally:
        for root in NODE_ROOTS:
            shutil.rmtree(root / "code" / name, ignore_errors=True)
            for run_id in (older, newer):
                shutil.rmtree(root / "runs" / run_id, ignore_errors=True)
