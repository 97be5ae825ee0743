"""torchherd disconnect: the kept SSH connections closed by the disconnect playbook; its line,
its --json document and its exit code."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from driver import connections, paths
from driver.cli import main
from driver.result import Exit
from driver.runner import Outcome

SCHEMA = json.loads((Path(connections.__file__).parent / "schema.json").read_text())
PLAYBOOK = (paths.CHECKOUT / "collection" / "ansible_collections" / "torchherd" / "cluster"
            / "playbooks" / "disconnect.yml")


def test_the_playbook_only_resets_each_nodes_connection():
    """Nothing runs on a node: Ansible's reset of the connection, on the controller."""
    plays = yaml.safe_load(PLAYBOOK.read_text())
    assert [p["hosts"] for p in plays] == ["all"]
    assert plays[0]["gather_facts"] is False
    assert [t.get("ansible.builtin.meta") for t in plays[0]["tasks"]] == ["reset_connection"]


@pytest.mark.parametrize(("rc", "code"), [(0, Exit.OK), (2, Exit.ERROR)])
def test_the_report_follows_the_playbook(rc, code, tmp_path, monkeypatch):
    inventory = tmp_path / "cluster.ini"
    inventory.write_text("[torchherd_nodes]\ngpu01\n")
    ran = {}

    def fake_run(name, source, extravars, **kwargs):
        ran.update(name=name, source=source, extravars=extravars)
        return Outcome(status="successful" if rc == 0 else "failed", rc=rc,
                       errors=[] if rc == 0 else ["Could not match supplied host pattern"])

    monkeypatch.setattr(connections, "run_playbook", fake_run)
    report = connections.disconnect(inventory)
    assert ran == {"name": "disconnect", "source": str(inventory.resolve()), "extravars": {}}
    assert report.exit_code == code
    assert bool(report.reason) == (rc != 0)
    jsonschema.validate(report.to_dict(), SCHEMA)


@pytest.mark.parametrize("as_json", [False, True])
def test_the_cli_says_so_or_prints_one_document(as_json, monkeypatch, capsys):
    monkeypatch.setattr("driver.api.disconnect", lambda inventory, **kwargs:
                        connections.DisconnectReport(str(inventory)))
    code = main(["disconnect", "-i", "inventories/cluster.ini", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    assert code == Exit.OK
    if as_json:
        doc = json.loads(out)
        jsonschema.validate(doc, SCHEMA)
        assert doc == {"action": "disconnect", "inventory": "inventories/cluster.ini",
                       "exit_code": 0, "exit_name": "ok", "reason": ""}
    else:
        assert "connections kept open to the nodes of inventories/cluster.ini are closed" in err


def test_disconnect_needs_an_inventory(capsys):
    assert main(["disconnect", "--json"]) == Exit.USAGE
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["action"] == "disconnect" and "-i/--inventory" in doc["reason"]
