"""The driver and ansible-playbook accept and refuse the same job specs, in the same words.

Each spec goes through (a) driver.spec.validate and the plan filter called from Python, and
(b) a real ansible-playbook run of the plan role's argument validation (on import_role, as in
playbooks/launch.yml) and of the plan filter, with the checkout's collection. One run checks
every spec: each is a host of its own (playbooks/spec_agreement.yml). No node is contacted
(their addresses are documentation addresses that route nowhere), so no cluster is needed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.torchherd.cluster.plugins.filter.plan import plan
from driver.paths import CHECKOUT
from driver.spec import JobSpecError, validate

RUN_ID = "20250101-120000-0a1b"
# Host variables as an INI inventory's host line gives them: strings.
NODES = {
    "node0": {"ansible_host": "192.0.2.1", "torchherd_root": "/scratch/th"},
    "node1": {"ansible_host": "192.0.2.2", "torchherd_firewall_enabled": "false",
              "torchherd_firewall_persistent": "yes"},
}
# As inventories/local.ini has it: a template the plan must read resolved.
GROUP_VARS = "ansible_python_interpreter={{ ansible_playbook_python }}"

SPECS: list[dict[str, Any]] = [
    # accepted
    {"script": "train.py"},
    {"script": "train.py", "firewall": "on"},
    {"script": "train.py", "firewall": 1},
    {"script": "train.py", "firewall": "off", "detach": "yes", "timeout": "60"},
    {"script": "train.py", "nproc_per_node": "2", "master_port": "29600"},
    {"script": "train.py", "master_port": "auto"},
    {"script": "train.py", "nproc_per_node": "auto", "python": "/opt/venv/bin/python"},
    {"script": "train.py", "args": ["--epochs", 3], "env": {"A": "1"}, "rdzv": "c10d",
     "nnodes": "1:2", "backend": "gloo", "run_id": "exp-1"},
    {"script": "train.py", "firewall_mode": "ports", "firewall_ports": [50000, "51000-51999"]},
    # accepted by the argument spec, refused by the plan
    {"script": "train.py", "nproc_per_node": 0},
    {"script": "train.py", "nproc_per_node": "two"},
    {"script": "train.py", "master_port": 70000},
    {"script": "train.py", "master_port": "x"},
    {"script": "train.py", "master_port": 1.5},
    {"script": ""},
    {"script": "train.py", "firewall_mode": "ports"},
    {"script": "train.py", "nnodes": "1:2"},
    # refused by the argument spec
    {"script": "train.py", "firewall": "maybe"},
    {"script": "train.py", "nproc": 2},
    {"args": ["--epochs", "3"]},
    {"script": "train.py", "backend": "mpi"},
    {"script": "train.py", "rdzv": "etcd"},
    {"script": "train.py", "launcher": "pdsh"},
    {"script": "train.py", "env": ["A=1"]},
    {"script": "train.py", "timeout": "soon", "zz": 1},
    {"script": "train.py", "detach": "later", "rdzv_conf": "x"},
]

_RESULT = re.compile(r"^(ok|fatal): \[(spec\d+)\](?:: FAILED!)? => (\{.*\})$")
# Two differences in Ansible's words that are not the spec's: it lists the valid booleans from
# a set (the order differs from process to process), and it names the class of the value,
# which in a playbook carries Ansible's data tags (a list is an _AnsibleTaggedList there).
_BOOLEANS = re.compile(r"(Valid booleans include: )([^\n]*)")
_TAGGED = re.compile(r"<class 'ansible\.[\w.]*\._AnsibleTagged(\w+)'>")


def _normal(text: str) -> str:
    text = _TAGGED.sub(lambda m: f"<class '{m.group(1).lower()}'>", text)
    return _BOOLEANS.sub(lambda m: m.group(1) + ", ".join(sorted(m.group(2).split(", "))), text)


def _driver(job: dict[str, Any]) -> tuple[str, Any]:
    """What the driver's entry point says: refused (its message), or the plan's outcome."""
    try:
        validated = validate(job)
    except JobSpecError as exc:
        return "refused", str(exc)
    hostvars = {name: dict(hv, ansible_python_interpreter=sys.executable)
                for name, hv in NODES.items()}
    try:
        return "planned", plan(validated, {"torchherd_nodes": list(NODES)}, hostvars, RUN_ID)
    except AnsibleFilterError as exc:
        return "unplanned", str(exc)


@pytest.fixture(scope="module")
def playbook_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, Any]]:
    """What ansible-playbook says for each spec, from one run."""
    tmp = tmp_path_factory.mktemp("spec_agreement")
    nodes = tmp / "nodes.ini"
    nodes.write_text("[torchherd_nodes]\n"
                     + "".join(f"{name} " + " ".join(f"{k}={v}" for k, v in hv.items()) + "\n"
                               for name, hv in NODES.items())
                     + f"\n[torchherd_nodes:vars]\n{GROUP_VARS}\n", encoding="utf-8")
    specs = tmp / "specs.yml"  # JSON is YAML: the values keep their types
    specs.write_text(json.dumps({"torchherd_specs": {
        "hosts": {f"spec{i}": {"torchherd_job": job} for i, job in enumerate(SPECS)},
        "vars": {"ansible_connection": "local", "torchherd_test_run_id": RUN_ID},
    }}), encoding="utf-8")
    env = dict(os.environ, ANSIBLE_CONFIG=str(CHECKOUT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_CALLBACK_FORMAT_PRETTY="false")
    # python -m ansible: ansible_playbook_python is then this interpreter.
    proc = subprocess.run(
        [sys.executable, "-m", "ansible", "playbook", "-i", str(nodes), "-i", str(specs),
         "--tags", "torchherd_spec_agreement",
         str(Path(__file__).parent / "playbooks" / "spec_agreement.yml")],
        cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=120, check=False)
    results: dict[str, tuple[str, Any]] = {}
    for line in proc.stdout.splitlines():
        match = _RESULT.match(line)
        if not match:
            continue
        status, host, body = match.groups()
        msg = json.loads(body)["msg"]
        if status == "ok":
            results[host] = ("planned", msg)
        elif msg.startswith("Validation of arguments failed:"):
            results[host] = ("refused", msg)
        else:
            results[host] = ("unplanned", msg)
    assert len(results) == len(SPECS), proc.stdout + proc.stderr
    return results


@pytest.mark.parametrize("index", range(len(SPECS)), ids=[json.dumps(s) for s in SPECS])
def test_both_entry_points_agree(index: int, playbook_results: dict[str, tuple[str, Any]]):
    driver_says, driver_detail = _driver(SPECS[index])
    playbook_says, playbook_detail = playbook_results[f"spec{index}"]
    assert driver_says == playbook_says, (driver_detail, playbook_detail)
    if driver_says == "refused":
        # The driver's own words first; then Ansible's, which are the playbook's.
        words = driver_detail.split("\nAnsible's validator says: ")[1]
        assert _normal(words) in _normal(playbook_detail)
    elif driver_says == "unplanned":
        assert driver_detail in playbook_detail
    else:
        assert json.loads(json.dumps(driver_detail)) == playbook_detail


def test_the_plan_reads_host_variables_templated_and_coerced(playbook_results):
    """The python template is resolved; the INI strings 'false' and 'yes' are booleans."""
    node0, node1 = playbook_results["spec0"][1]["nodes"]
    assert node0["python"] == node1["python"] == sys.executable
    assert (node0["root"], node0["code_dir"]) == ("/scratch/th", "/scratch/th/code/train")
    assert node0["firewall"]["enabled"] is True and node1["firewall"]["enabled"] is False
    assert node1["firewall"]["persistent"] is True
    assert playbook_results["spec0"][1]["run_id"] == RUN_ID


def test_the_spec_list_covers_every_outcome(playbook_results):
    outcomes = {says for says, _ in playbook_results.values()}
    assert outcomes == {"planned", "unplanned", "refused"}
