"""A plain `ansible-playbook playbooks/launch.yml` on the embedded default (inventories/local.ini:
two nodes on this machine, no cluster): the job runs, and Ansible prints no deprecation warning
(the watch runs on a built-in strategy; a collection's own strategy plugin is deprecated in
ansible-core 2.19 and warned about on every launch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from driver.paths import CHECKOUT


def test_launch_playbook_runs_without_deprecation_warnings(tmp_path: Path) -> None:
    run_id = f"local-{uuid.uuid4().hex[:8]}"  # the nodes keep their run directories
    job = tmp_path / "job.yml"
    job.write_text(json.dumps({"torchherd_job": {
        "script": "allreduce.py", "code_src": str(CHECKOUT / "examples"), "nproc_per_node": 1,
        "runs_dir": str(tmp_path / "runs"), "run_id": run_id}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(CHECKOUT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/launch.yml",
         "-i", "inventories/local.ini", "-e", f"@{job}"],
        cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "DEPRECATION" not in output.upper(), output[-3000:]
    summary = json.loads((tmp_path / "runs" / run_id / "summary.json").read_text())
    assert summary["state"] == "succeeded", summary
