"""Fixtures for tests on a real container cluster (tests/cluster/testbed.py).

Without podman the cluster tests are skipped, unless TORCHHERD_REQUIRE_CLUSTER=1 (CI), where a
missing cluster must fail the run instead of passing it silently.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path

import pytest

# `pytest` run as a script does not put the checkout on sys.path (python -m pytest does).
_REPO = Path(__file__).resolve().parents[2]
if str(_REPO) not in sys.path:
    sys.path.insert(0, str(_REPO))
# The collection is importable as ansible_collections.torchherd.cluster from a checkout (the
# tests call its pure filters, as the plan role does).
if str(_REPO / "collection") not in sys.path:
    sys.path.insert(0, str(_REPO / "collection"))

from tests.cluster import testbed  # noqa: E402
from tests.integration.helpers import (  # noqa: E402
    build_wheel,
    checkout_key,
    made_once,
    own_control_path,
)

MakeCluster = Callable[..., testbed.Cluster]

# Below testbed.AUTO_SUBNET_START: make_cluster's own clusters take free subnets above it.
_CLUSTER3_SUBNET = 1


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: needs the podman container cluster")


@pytest.fixture(scope="session")
def node_image() -> str:
    """The node image tag, built on first use (about 90 s from nothing, < 1 s when present)."""
    if shutil.which("podman") is None:
        reason = "podman is not installed (run scripts/install-system-deps.sh)"
        if os.environ.get("TORCHHERD_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"TORCHHERD_REQUIRE_CLUSTER=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return testbed.build()


@pytest.fixture(scope="session")
def suite_shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the whole suite run shares: the xdist workers' base temps are folders of
    the run's own, which pytest removes with the run's (it keeps the last few runs)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if "PYTEST_XDIST_WORKER" in os.environ else base) / "shared"


@pytest.fixture(scope="session")
def wheel(suite_shared: Path) -> Path:
    """The wheel of this checkout, built once for the suite run (helpers.build_wheel) and
    shared by every test that installs it; keyed by the checkout's content, so a checkout
    edited during the run gets a wheel of its own, as a fresh build would."""
    built = made_once(suite_shared, f"wheel-{checkout_key()}", build_wheel)
    return next((built / "dist").glob("torchherd-*.whl"))


@pytest.fixture(scope="session")
def cluster3(node_image: str) -> Iterator[testbed.Cluster]:
    """Three nodes it3-node0..2, shared by the whole session: tests must leave them healthy."""
    with testbed.reserve("it3"):
        try:  # also a cluster that did not come up whole: its containers go
            yield testbed.up("it3", 3, _CLUSTER3_SUBNET)
        finally:
            testbed.down("it3")


@pytest.fixture(scope="session")
def uneven(node_image: str) -> Iterator[testbed.Cluster]:
    """Three nodes on two networks (SSH on one, the job on the other, interface names that
    differ per node); node2 without IPv6. Shared by the session: tests must leave the nodes
    healthy (no job left, no link throttled)."""
    with testbed.reserve("uneven"):
        try:
            yield testbed.up("uneven", 3, data_network=True, no_ipv6=[2])
        finally:
            testbed.down("uneven")


@pytest.fixture
def make_cluster(node_image: str) -> Iterator[MakeCluster]:
    """Factory for a test's own cluster: make_cluster(name, n, extra=()); removed afterwards."""
    with ExitStack() as reservations:
        reserved: set[str] = set()

        def make(
            name: str, n: int, extra: Sequence[str] = (), subnet_index: int | None = None
        ) -> testbed.Cluster:
            if name not in reserved:  # a second flock from this process would wait forever
                reservations.enter_context(testbed.reserve(name))
                reservations.callback(testbed.down, name)
                reserved.add(name)
            return testbed.up(name, n, subnet_index, extra=extra)

        yield make


@pytest.fixture
def own_masters(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The test's SSH connection masters (ControlPersist) in a directory of its own, which it
    may drop or start without: no master of an earlier test carries its connections, and
    dropping its own cuts no test that runs beside it."""
    with own_control_path() as cpdir:
        monkeypatch.setenv("ANSIBLE_SSH_CONTROL_PATH_DIR", str(cpdir))
        yield cpdir


# Side by side (pytest-xdist, `--dist loadgroup`, as scripts/test.sh runs the suite):
# - tests that share a session cluster run in one worker, or each worker would bring up its own
#   copy under the same name and wait on the other's reservation;
# - tests on this machine's own nodes (the embedded default's kind: loopback addresses, the
#   default master port, the roots under ~/.torchherd/local) run in one worker, one after the
#   other, as they would collide side by side; so do the other tests of their modules, which
#   then build the modules' fixtures (a wheel, a playbook run) once;
# - every other test keeps its module's worker, where its module-scoped cluster lives.
# Container clusters have networks of their own: groups of different clusters do not disturb
# each other.
SHARED_CLUSTERS = ("cluster3", "uneven")
LOCAL_NODES_GROUP = "local-nodes"


def _on_local_nodes(item: pytest.Item) -> bool:
    # No container cluster in its fixtures: it runs on this machine's own nodes.
    return "node_image" not in getattr(item, "fixturenames", ())


def run_groups(items: Sequence[pytest.Item]) -> dict[str, str]:
    """The xdist group of each collected test (by node id): see above."""
    local_modules = {item.module for item in items if _on_local_nodes(item)}
    groups = {}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        shared = [name for name in SHARED_CLUSTERS if name in fixtures]
        if shared:
            groups[item.nodeid] = shared[0]
        elif item.module in local_modules:
            groups[item.nodeid] = LOCAL_NODES_GROUP
        else:
            groups[item.nodeid] = item.module.__name__
    return groups


# Before xdist's own hook, which reads the groups into the tests' ids.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item, group in zip(items, run_groups(items).values(), strict=True):
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """In an xdist worker of a --dist loadgroup run, every test's id carries its group, or the
    groups above are not kept and the shared clusters would be wanted by two workers at once
    (one waiting on the other's reservation for the whole run)."""
    if "PYTEST_XDIST_WORKER" not in os.environ or not session.config.getvalue("loadgroup"):
        return
    ungrouped = [item.nodeid for item in session.items if "@" not in item.nodeid]
    if ungrouped:
        raise pytest.UsageError(
            f"pytest-xdist did not take the tests' groups ({ungrouped[0]} has none): pytest "
            f"{pytest.__version__} with this pytest-xdist; install the versions pyproject.toml "
            f"pins (scripts/setup.sh)")
