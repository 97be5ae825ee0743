"""Jobs inside a container image (job key container), on nodes that run a real container runtime:
Debian's podman inside each test node (privileged, see testbed.up's container_runtime), the job
image the node image itself (its Python, torch and launchers), in a read-only image store the
nodes share. podman because it runs rootful inside the node without a daemon; docker would need
dockerd in every node. Real SSH, real podman, real gloo: a 3 x 2 DDP job in the image, status,
stacks, stop and a rank raising in the image, the secret on no command line, in no file, not in
podman inspect, and preflight refusing a node without the runtime, an image missing under pull
never, an image whose torch differs, and a runtime that cannot start the container (a limit it
cannot set, named with the option that starts it). A real pull too: a registry (Debian's
docker-registry) on the host, on the cluster's network, serving a small image that every node
pulls itself."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from driver import Exit, launch, stacks, status, stop, verify
from tests.cluster import testbed
from tests.integration.helpers import assert_no_job_left, wait_for

pytestmark = pytest.mark.cluster

JOB = """import hashlib, json, os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
model(torch.ones(2, 4)).sum().backward()
value = torch.tensor([float(rank)])
dist.all_reduce(value)
secret = os.environ.get("TH_SECRET", "")
print("torchherd-ctr " + json.dumps({
    "rank": rank, "world": dist.get_world_size(), "sum": value.item(),
    "in_image": os.path.exists("/run/.containerenv"), "python": sys.executable,
    "secret": hashlib.sha256(secret.encode()).hexdigest()}), flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    print(f"torchherd-ctr-fail rank={rank} t={time.time()}", flush=True)
    raise RuntimeError("this rank fails on purpose")
time.sleep(float(os.environ.get("SLEEP", "0")))
dist.destroy_process_group()
"""
LINE = re.compile(r"torchherd-ctr (\{.*\})")
ROOT = "/root/.torchherd"


@pytest.fixture(scope="module")
def ctr(node_image: str) -> Iterator[tuple[testbed.Cluster, str]]:
    """Three nodes that run podman, and the job image every one of them has."""
    with testbed.reserve("ctr"):
        try:
            cluster = testbed.up("ctr", 3, container_runtime=True)
            yield cluster, testbed.job_images()[1]
        finally:
            testbed.down("ctr")


@pytest.fixture
def code(tmp_path: Path) -> Path:
    src = tmp_path / "code"
    src.mkdir()
    (src / "job.py").write_text(JOB)
    return src


def job(code: Path, image: str, run_id: str, **extra) -> dict:
    return {"script": "job.py", "code_src": str(code), "nproc_per_node": 2, "run_id": run_id,
            "container": {"image": image, "pull": "never"}, **extra}


def said(runs: Path, run_id: str, cluster: testbed.Cluster) -> list[dict]:
    found = []
    for node in cluster.nodes:
        text = (runs / run_id / "nodes" / node.name / "node.log").read_text()
        found += [json.loads(m) for m in LINE.findall(text)]
    return sorted(found, key=lambda line: line["rank"])


def containers(cluster: testbed.Cluster) -> dict[str, list[str]]:
    return {node.name: cluster.exec(node, ["podman", "ps", "--all", "--format", "{{.Names}}"])
            .stdout.split() for node in cluster.nodes}


def assert_nothing_left(cluster: testbed.Cluster) -> None:
    assert containers(cluster) == {node.name: [] for node in cluster.nodes}
    assert_no_job_left(cluster, "job.py")


def wait_for_lines(cluster: testbed.Cluster, run_id: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    for node in cluster.nodes:
        while True:
            log = cluster.exec(node, ["cat", f"{ROOT}/runs/{run_id}/node.log"], check=False).stdout
            if len(LINE.findall(log)) >= 2:
                break
            assert time.monotonic() < deadline, f"{node.name} said nothing: {log[-2000:]}"
            time.sleep(1)


def test_a_ddp_job_runs_in_the_image_and_its_secret_is_nowhere_else(ctr, code, tmp_path):
    cluster, image = ctr
    secret = "th-" + secrets.token_hex(16)
    launched = launch(job(code, image, "ctr-ddp", env={"SLEEP": "300"},
                          secret_env={"TH_SECRET": secret}, detach=True),
                      cluster.inventory, runs_dir=tmp_path)
    assert launched.ok, launched.reason
    facts = json.loads((tmp_path / "ctr-ddp" / "preflight.json").read_text())["facts"]
    for found in facts.values():
        assert found["container"]["runtime"] == "podman" and not found["container"]["error"]
        assert found["python"]["executable"] == "python3"
        assert found["torch"]["version"].startswith("2.13.0")
    wait_for_lines(cluster, "ctr-ddp")

    names = {node.name: f"torchherd-ctr-ddp-n{i}-r0" for i, node in enumerate(cluster.nodes)}
    assert containers(cluster) == {host: [name] for host, name in names.items()}
    for node in cluster.nodes:
        inspected = cluster.exec(node, ["podman", "inspect", names[node.name]]).stdout
        assert json.loads(inspected)[0]["Config"]["Env"], "inspect shows the container's env"
        assert secret not in inspected
        # No command line on the node, and no file torchherd wrote there.
        cmdlines = cluster.exec(node, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"],
                                check=False).stdout
        assert "job.py" in cmdlines and secret not in cmdlines
        grep = cluster.exec(node, ["grep", "-r", "-l", secret, ROOT], check=False)
        assert grep.returncode == 1, f"{node.name}: {grep.stdout}"

    running = status("ctr-ddp", runs_dir=tmp_path)
    assert {h["state"] for h in running.hosts.values()} == {"running"}, running.reason
    read = stacks("ctr-ddp", runs_dir=tmp_path)
    assert read.ok, read.reason
    assert sorted(r["rank"] for r in read.stacks["ranks"]) == list(range(6))
    assert {r["own"].split(" ")[0] for r in read.stacks["ranks"]} == {"<module>"}

    stopped = stop("ctr-ddp", runs_dir=tmp_path)
    assert {h["state"] for h in stopped.hosts.values()} == {"stopped"}, stopped.reason
    assert_nothing_left(cluster)
    lines = said(tmp_path, "ctr-ddp", cluster)
    assert [line["rank"] for line in lines] == list(range(6))
    assert {(line["world"], line["sum"], line["in_image"]) for line in lines} == {(6, 15.0, True)}
    assert {line["secret"] for line in lines} == {hashlib.sha256(secret.encode()).hexdigest()}
    # Nor in anything that came back to the controller.
    for path in (tmp_path / "ctr-ddp").rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="replace"), path


def test_a_rank_raising_in_the_image_stops_every_node(ctr, code, tmp_path):
    cluster, image = ctr
    result = launch(job(code, image, "ctr-fail", env={"FAIL_RANK": "3", "SLEEP": "120"}),
                    cluster.inventory, runs_dir=tmp_path)
    returned = time.time()
    assert result.exit_code == Exit.JOB_FAILED, result.reason
    summary = json.loads((tmp_path / "ctr-fail" / "summary.json").read_text())
    failed = summary["hosts"][cluster.nodes[1].name]
    assert failed["state"] == "failed" and failed["failing_rank"] == 3, failed
    log = (tmp_path / "ctr-fail" / "nodes" / cluster.nodes[1].name / "node.log").read_text()
    failed_at = float(re.search(r"torchherd-ctr-fail rank=3 t=([\d.]+)", log).group(1))
    for node in cluster.nodes:
        ended = summary["hosts"][node.name]["ended_at"]
        assert ended - failed_at < 10, f"{node.name} ran {ended - failed_at:.1f} s on"
    assert_nothing_left(cluster)
    print(f"container: failure -> all stopped "
          f"{max(h['ended_at'] for h in summary['hosts'].values()) - failed_at:.1f} s, "
          f"-> launch returned {returned - failed_at:.1f} s")


def test_preflight_names_the_node_without_runtime_image_or_the_same_torch(ctr, code, tmp_path):
    cluster, image = ctr
    first, second, third = cluster.nodes
    test_image = "localhost/torchherd-job:test"
    # node0: the image under the job's name; node1: none of it; node2: one whose torch differs.
    cluster.exec(first, ["podman", "tag", image, test_image])
    odd = (f"FROM {image}\nRUN sed -i \"s/^__version__ = .*/__version__ = '2.13.0+odd'/\" "
           "$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')/version.py\n")
    testbed.run(["podman", "exec", "-i", third.name, "podman", "build", "--quiet",
                 "--tag", test_image, "--file", "-", "/tmp"], input=odd)
    try:
        result = verify(job(code, test_image, "ctr-refused"), cluster.inventory,
                        runs_dir=tmp_path)
        assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
        problems = {(p["host"], p["check"]): p for p in result.problems}
        assert set(problems) == {(second.name, "container"), (third.name, "same torch.version")}
        assert "pull policy is never" in problems[second.name, "container"]["found"]
        assert problems[third.name, "same torch.version"]["found"] == "2.13.0+odd"

        # A node without the runtime (node1's podman moved away).
        cluster.exec(second, ["mv", "/usr/bin/podman", "/usr/bin/podman.off"])
        try:
            result = verify(job(code, image, "ctr-no-runtime"), cluster.inventory,
                            runs_dir=tmp_path)
        finally:
            cluster.exec(second, ["mv", "/usr/bin/podman.off", "/usr/bin/podman"])
        assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
        assert [(p["host"], p["check"]) for p in result.problems] == [(second.name, "container")]
        assert "no container runtime" in result.problems[0]["found"]
    finally:
        for node in (first, third):
            cluster.exec(node, ["podman", "rmi", "--force", test_image], check=False)


def test_preflight_names_a_runtime_that_cannot_start_the_container_and_the_option_that_does(
        ctr, code, tmp_path):
    cluster, image = ctr
    second = cluster.nodes[1]
    conf = "/etc/containers/containers.conf"
    # Warm the torch probe's cache on every node: a cached reading must not hide what follows.
    warm = verify(job(code, image, "ctr-start-warm"), cluster.inventory, runs_dir=tmp_path)
    assert warm.ok, warm.reason
    # node1's podman asks for more open files than the node allows, as a stock podman does in
    # a container (its default 1048576 over the hard limit): runc cannot set the limit.
    cluster.exec(second, ["sed", "-i.th", "s/nofile=20000:20000/nofile=65536:65536/", conf])
    try:
        result = verify(job(code, image, "ctr-start"), cluster.inventory, runs_dir=tmp_path)
        assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
        assert [(p["host"], p["check"]) for p in result.problems] == [
            (second.name, "container runtime")]
        problem = result.problems[0]
        assert "error setting rlimit type 7" in problem["found"], problem
        facts = json.loads((tmp_path / "ctr-start" / "preflight.json").read_text())["facts"]
        start = facts[second.name]["container"]["start"]
        assert start["started"] and start["ulimits"][0].startswith("--ulimit=nofile="), start
        assert problem["fix"].startswith(f"add options: ['{start['ulimits'][0]}'")
        # The option named: the job starts its containers there.
        fixed = verify(job(code, image, "ctr-start-fixed", container={
            "image": image, "pull": "never", "options": start["ulimits"]}),
            cluster.inventory, runs_dir=tmp_path)
        assert fixed.ok, fixed.reason
    finally:
        cluster.exec(second, ["mv", f"{conf}.th", conf])

@pytest.fixture
def registry(ctr, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A registry on the host's address in the cluster's network (plain HTTP, as a registry
    inside a cluster may be), holding a small image the nodes do not have: its reference there
    and its id."""
    cluster, _ = ctr
    server = shutil.which("docker-registry")
    assert server, "docker-registry not installed: scripts/install-system-deps.sh installs it"
    network = json.loads(testbed.podman("network", "inspect", testbed.network_name(cluster.name))
                         .stdout)[0]
    host = network["subnets"][0]["gateway"]
    with socket.socket() as probe:  # a free port on that address
        probe.bind((host, 0))
        port = probe.getsockname()[1]
    (tmp_path / "config.yml").write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'blobs'}\n"
        f"http:\n  addr: {host}:{port}\n")
    proc = subprocess.Popen([server, "serve", str(tmp_path / "config.yml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    local = "localhost/torchherd-pull:test"
    try:
        def answers() -> bool:
            try:
                urllib.request.urlopen(f"http://{host}:{port}/v2/", timeout=2).close()
                return True
            except OSError:
                assert proc.poll() is None, "the registry exited"
                return False

        wait_for(answers, 30, "the registry", interval=0.2)
        context = tmp_path / "image"
        context.mkdir()
        (context / "marker").write_text("torchherd pull test\n")
        (context / "Containerfile").write_text("FROM scratch\nCOPY marker /marker\n")
        testbed.podman("build", "--quiet", "--tag", local, str(context))
        ref = f"{host}:{port}/torchherd-pull:1"
        testbed.podman("push", "--quiet", "--tls-verify=false", local, f"docker://{ref}")
        yield ref, testbed.podman("image", "inspect", "--format", "{{.Id}}", local).stdout.strip()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        testbed.podman("rmi", "--force", local, check=False)


def test_every_node_pulls_the_image_from_a_registry_and_says_so(ctr, registry, code, tmp_path):
    cluster, _ = ctr
    first, second, third = cluster.nodes
    registry, ident = registry
    # The registry speaks plain HTTP: node0 and node2 are configured to accept that (as a
    # cluster's own registry would be), node1 is not, so its pull fails as such a node's would.
    conf = "/etc/containers/registries.conf.d/50-torchherd-test.conf"
    address = registry.split("/", 1)[0]
    text = f'[[registry]]\nlocation = "{address}"\ninsecure = true\n'
    for node in (first, third):
        write = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"
        cluster.exec(node, ["python3", "-c", write, conf, text])
    pulled = {"script": "job.py", "code_src": str(code), "nproc_per_node": 2,
              "container": {"image": registry, "pull": "always"}}
    try:
        result = verify(dict(pulled, run_id="ctr-pull"), cluster.inventory, runs_dir=tmp_path)
        assert result.exit_code == Exit.PREFLIGHT_FAILED, result.reason
        problems = {(p["host"], p["check"]): p for p in result.problems}
        # The image holds one file and no Python: once pulled, preflight ran it and says so.
        assert set(problems) == {(first.name, "python"), (second.name, "container"),
                                 (third.name, "python")}, problems
        assert "python3" in problems[first.name, "python"]["found"]
        found = problems[second.name, "container"]["found"]
        assert f"pull {registry} failed" in found and "HTTPS" in found, found
        for node in (first, third):
            image = result.hosts[node.name]["container"]
            assert image["pulled"] is True and image["id"] == ident, image
            assert cluster.exec(node, ["podman", "image", "inspect", "--format", "{{.Id}}",
                                       registry]).stdout.strip() == ident
        assert not result.hosts[second.name]["container"]["pulled"]

        # Pull "missing": where the node has the image it is found, not pulled again.
        result = verify(dict(pulled, run_id="ctr-found", container={"image": registry}),
                        cluster.inventory, runs_dir=tmp_path)
        for node in (first, third):
            image = result.hosts[node.name]["container"]
            assert image["pulled"] is False and image["id"] == ident, image
    finally:
        for node in cluster.nodes:
            cluster.exec(node, ["rm", "-f", conf], check=False)
            cluster.exec(node, ["podman", "rmi", "--force", registry], check=False)
