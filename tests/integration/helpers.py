"""What the integration tests share: the checkout's examples and result schema, the CLI as a
user runs it, a wait for a condition with a deadline, and the checks that a job is gone."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
# What --json prints: every command's one document validates against it.
SCHEMA = json.loads((REPO / "driver" / "schema.json").read_text())
# torchrun and the ranks of examples/allreduce.py.
JOB_PROCS = r"torch\.distributed\.run|allreduce\.py"

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
    """predicate's first true value, asked every `interval` s and once more at the deadline, so
    that a slow last ask still counts; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@contextlib.contextmanager
def own_control_path() -> Iterator[Path]:
    """A directory of the test's own for SSH connection masters (ANSIBLE_SSH_CONTROL_PATH_DIR):
    what the test does to its masters (drop them, or start without any) touches no other test
    that runs beside it. Short, under /tmp: a socket's path has at most 107 bytes. Its masters
    are told to exit at the end."""
    cpdir = Path(tempfile.mkdtemp(prefix="th-cp-", dir="/tmp"))
    try:
        yield cpdir
    finally:
        subprocess.run(["pkill", "-f", f"ssh: {cpdir}/"], check=False)
        shutil.rmtree(cpdir, ignore_errors=True)


def _tracked() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    return sorted(filter(None, listed))


def checkout_key() -> str:
    """A digest of the checkout's tracked files as they are now: what build_wheel packs."""
    digest = hashlib.sha256()
    for name in _tracked():
        path = REPO / name
        digest.update(name.encode() + b"\0")
        if path.is_symlink():
            digest.update(os.readlink(path).encode())
        elif path.is_file():
            digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def made_once(shared: Path, name: str, make: Callable[[Path], object]) -> Path:
    """shared/name, filled by make(shared/name) by its first caller; later callers (other
    pytest-xdist workers of the same run among them, under a file lock) wait for it and find it
    made. A make that failed counts for nothing: the next caller starts over."""
    shared.mkdir(parents=True, exist_ok=True)
    target, done = shared / name, shared / f"{name}.done"
    with open(shared / f"{name}.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            make(target)
            done.touch()
    return target


def build_wheel(root: Path) -> Path:
    """The wheel of this checkout's tracked files, built in a copy under `root` (building
    writes build/ and *.egg-info into the tree), as `pip wheel` builds it for a user."""
    source = root / "source"
    for name in _tracked():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        if (REPO / name).is_symlink():  # the templates the wheel ships (torchherd/templates)
            os.symlink(os.readlink(REPO / name), source / name)
        elif (REPO / name).is_file():
            shutil.copy2(REPO / name, source / name)
    dist = root / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-q", "-w", str(dist), str(source)],
                           cwd=root, capture_output=True, text=True, check=False)
    assert built.returncode == 0, built.stderr[-3000:]
    shutil.rmtree(source)
    return next(dist.glob("torchherd-*.whl"))


def per_node(ask: Callable[[Any], T], nodes: Iterable[Any]) -> list[T]:
    """ask(node) for each node, in the nodes' order, every node asked at once: each ask is a
    podman exec or two (about 0.25 s each on a quiet machine, several times that on a busy one),
    and the nodes answer independently."""
    nodes = list(nodes)
    with ThreadPoolExecutor(len(nodes)) as pool:
        return list(pool.map(ask, nodes))


def assert_no_job_left(cluster: Any, pattern: str = JOB_PROCS,
                       nodes: Iterable[Any] | None = None) -> None:
    """No process whose command line matches `pattern` on the nodes (default: all of them)."""
    nodes = list(nodes or cluster.nodes)
    found = per_node(lambda node: cluster.pids(node, pattern), nodes)
    for node, pids in zip(nodes, found, strict=True):
        assert pids == [], f"a job process is left on {node.name}"


def assert_failed_fast(run_dir: Path, cluster: Any, rank: int, exception: str, returned: float,
                       label: str, job_procs: str = JOB_PROCS) -> None:
    """Rank `rank` (on node 1) raised RuntimeError(exception): summary.json names node, rank and
    exception, every node stopped within 10 s of it, the launch returned within 15 s, and
    nothing is left."""
    summary = json.loads((run_dir / "summary.json").read_text())
    failed = summary["hosts"][cluster.nodes[1].name]
    assert failed["state"] == "failed" and failed["failing_rank"] == rank, failed
    assert failed["exception"] == f"RuntimeError: {exception}"
    assert cluster.nodes[1].name in summary["reason"] and f"rank {rank}" in summary["reason"]
    log = (run_dir / "nodes" / cluster.nodes[1].name / "node.log").read_text()
    failed_at = float(re.search(rf"torchherd-fail rank={rank} t=([\d.]+)", log).group(1))
    for node in cluster.nodes:
        ended = summary["hosts"][node.name]["ended_at"]
        assert ended - failed_at < 10, f"{node.name} ran {ended - failed_at:.1f} s on"
    assert returned - failed_at < 15
    assert_no_job_left(cluster, job_procs)
    last_end = max(h["ended_at"] for h in summary["hosts"].values())
    print(f"{label}: failure -> all stopped {last_end - failed_at:.1f} s, "
          f"failure -> launch returned {returned - failed_at:.1f} s")


def torchherd(*argv: str) -> subprocess.CompletedProcess[str]:
    """The CLI run to its end from the checkout, without the caller's Ansible settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return subprocess.run([sys.executable, "-m", "driver", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
