"""A locked venv, the same on every node: three container nodes without uv, a wheelhouse served
over HTTP from one of them on the test network (no outside network), a small lock. The first
launch installs uv (pip, into torchherd's directory) and makes the venv on every node, the
relaunch reuses it, a changed lock makes a new one; a lock that pins nothing, or a version the
wheelhouse lacks, is refused. Real SSH, real uv, real gloo."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from driver import UsageError, launch, verify
from tests.cluster import testbed
from tests.cluster.wheels import pure_wheel, uv_binary, uv_wheel

pytestmark = pytest.mark.cluster

JOB = """import sys
import torch.distributed as dist
try:
    from thpin import VALUE
except ImportError:
    VALUE = "none"
dist.init_process_group("gloo")
t = __import__("torch").tensor([float(dist.get_rank())])
dist.all_reduce(t)
print(f"venv-job rank={dist.get_rank()} value={VALUE} python={sys.executable} "
      f"sum={t.item():g}", flush=True)
dist.destroy_process_group()
"""
WAIT_FOR = """import sys, time, urllib.request
for _ in range(120):
    try:
        urllib.request.urlopen(sys.argv[1], timeout=2).read()
        break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit("the wheelhouse never answered")
"""
LINE = re.compile(r"venv-job rank=(\d+) value=(\S+) python=(\S+) sum=(\S+)")
PORT = 8765


def lines(runs: Path, run_id: str, hosts) -> list[tuple[str, ...]]:
    found = []
    for host in hosts:
        found += LINE.findall((runs / run_id / "nodes" / host / "node.log").read_text())
    return sorted(found, key=lambda line: int(line[0]))


def venvs(runs: Path, run_id: str) -> dict[str, dict]:
    facts = json.loads((runs / run_id / "preflight.json").read_text())["facts"]
    return {host: f["venv"] for host, f in facts.items()}


def test_a_locked_venv_is_made_once_reused_and_remade_when_the_lock_changes(
        make_cluster, tmp_path):
    cluster = make_cluster("venv", 3)
    inventory = cluster.write_inventory()
    names = [n.name for n in cluster.nodes]
    for node in cluster.nodes:
        assert cluster.exec(node, ["sh", "-c", "command -v uv"], check=False).returncode != 0

    # The wheelhouse, served by node0 on the cluster's network.
    wheels = tmp_path / "wheels"
    pure_wheel(wheels, "thpin", "1.0", "one")
    pure_wheel(wheels, "thpin", "2.0", "two")
    served = cluster.nodes[0]
    testbed.podman("cp", str(uv_wheel()), f"{served.name}:/srv/")
    for wheel in wheels.iterdir():
        testbed.podman("cp", str(wheel), f"{served.name}:/srv/")
    testbed.podman("exec", "--detach", served.name, "python3", "-m", "http.server", str(PORT),
                   "--directory", "/srv")
    url = f"http://{served.data_ip or served.ip}:{PORT}/"
    # Up and reachable from another node before any launch counts on it.
    cluster.exec(cluster.nodes[1], ["python3", "-c", WAIT_FOR, url], timeout=90)

    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(JOB)
    (code / "requirements.lock").write_text("thpin==1.0\n")
    job = {"script": "job.py", "code_src": str(code), "nproc_per_node": 2,
           # The image's own torch (its system Python), the lock's packages on top.
           "venv": {"lock": "requirements.lock", "find_links": [url],
                    "system_site_packages": True}}
    timings = {}

    started = time.monotonic()
    result = launch({**job, "run_id": "made"}, inventory, runs_dir=tmp_path)
    timings["made"] = time.monotonic() - started
    assert result.ok, result.reason
    found = lines(tmp_path, "made", names)
    assert [int(r) for r, *_ in found] == list(range(6))
    assert {v for _, v, _, _ in found} == {"one"} and {s for *_, s in found} == {"15"}
    made = venvs(tmp_path, "made")
    assert all(v["made"] and not v.get("error") for v in made.values()), made
    assert {p for _, _, p, _ in found} == {v["python"] for v in made.values()}
    assert all("thpin==1.0" in v["packages"] for v in made.values())
    # uv came the way uv documents it (pip), into torchherd's directory, from the wheelhouse.
    for node in cluster.nodes:
        cluster.exec(node, ["/root/.torchherd/tools/uv/bin/uv", "--version"])

    started = time.monotonic()
    result = launch({**job, "run_id": "reused"}, inventory, runs_dir=tmp_path)
    timings["reused"] = time.monotonic() - started
    assert result.ok, result.reason
    reused = venvs(tmp_path, "reused")
    assert not any(v["made"] for v in reused.values()), reused
    assert {h: v["path"] for h, v in reused.items()} == {h: v["path"] for h, v in made.items()}
    assert {p for _, _, p, _ in lines(tmp_path, "reused", names)} == {
        v["python"] for v in made.values()}

    # A changed lock: a new venv beside the old one, which a running job may still use
    # (preflight makes it: verify is enough to see it).
    (code / "requirements.lock").write_text("thpin==2.0\n")
    checked = {**job, "interconnect": "never"}
    result = verify({**checked, "run_id": "changed"}, inventory, runs_dir=tmp_path)
    assert result.ok, result.reason
    changed = venvs(tmp_path, "changed")
    assert all(v["made"] and "thpin==2.0" in v["packages"] for v in changed.values()), changed
    assert all(changed[h]["path"] != made[h]["path"] for h in names)
    for node in cluster.nodes:
        cluster.exec(node, ["test", "-x", made[node.name]["python"]])
    print("launch seconds:", {k: round(v, 1) for k, v in timings.items()})

    # uv's own lock, with its project: exported on every node, the project itself left out.
    project = code / "proj"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "trainer"\nversion = "0.1"\nrequires-python = ">=3.9"\n'
        'dependencies = ["thpin==1.0"]\n')
    subprocess.run([str(uv_binary()), "lock", "--quiet", "--no-index", "--find-links",
                    str(wheels), "--project", str(project)], check=True,
                   env={**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")})
    result = verify({**checked, "venv": {**job["venv"], "lock": "proj/uv.lock"},
                     "run_id": "uv-lock"}, inventory, runs_dir=tmp_path)
    assert result.ok, result.reason
    locked = venvs(tmp_path, "uv-lock")
    assert all(v["made"] and "thpin==1.0" in v["packages"] for v in locked.values()), locked
    assert all(locked[h]["path"] not in (made[h]["path"], changed[h]["path"]) for h in names)

    # A lock that pins nothing is refused on the controller, before any node is touched.
    (code / "requirements.lock").write_text("thpin>=1.0\n")
    with pytest.raises(UsageError, match=r"job\.venv\.lock: expected every requirement"):
        verify({**checked, "run_id": "unpinned"}, inventory, runs_dir=tmp_path)
    # A version the wheelhouse lacks: every node named, with uv's own words.
    (code / "requirements.lock").write_text("thpin==9.9\n")
    result = verify({**checked, "run_id": "missing"}, inventory, runs_dir=tmp_path)
    assert result.state == "preflight_failed", result.reason
    assert {p["host"] for p in result.problems if p["check"] == "venv"} == set(names)
    assert all("thpin" in p["found"] for p in result.problems if p["check"] == "venv")
