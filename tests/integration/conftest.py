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
