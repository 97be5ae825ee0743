"""Choosing the interface of a job's traffic on a node: this machine's own routes, and
recorded interface tables for the cases it does not have."""

from __future__ import annotations

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils import _netpath
from ansible_collections.torchherd.cluster.plugins.module_utils._netpath import (
    interfaces,
    select,
)

TWO_NETWORKS = {"lo": ["127.0.0.1", "::1"], "mgmt0": ["10.66.101.11", "fe80::1"],
                "ib0": ["10.67.101.11", "fe80::2"]}


def test_the_route_to_the_master_picks_the_interface_on_this_machine():
    ifaces = interfaces()
    assert "lo" in ifaces and "127.0.0.1" in ifaces["lo"]
    chosen = select("127.0.0.1", ifaces=ifaces)
    # lo reports no link speed (the kernel has none for it).
    assert chosen == {"name": "lo", "address": "127.0.0.1", "how": "local",
                      "master": "127.0.0.1", "speed": None, "error": None}


def test_a_master_address_reached_over_another_interface(monkeypatch):
    monkeypatch.setattr(_netpath, "route_to", lambda address: (("ib0", "10.67.101.11"), None))
    chosen = select("10.67.101.10", ifaces=TWO_NETWORKS)
    assert (chosen["name"], chosen["address"], chosen["how"]) == ("ib0", "10.67.101.11",
                                                                  "route")


def test_the_master_node_takes_the_interface_that_holds_the_address():
    chosen = select("10.67.101.11", ifaces=TWO_NETWORKS)
    assert (chosen["name"], chosen["how"]) == ("ib0", "local")


def test_a_named_interface_wins_and_gives_its_address_of_the_masters_family():
    chosen = select("10.67.101.10", "mgmt0", ifaces=TWO_NETWORKS)
    assert (chosen["name"], chosen["address"], chosen["how"]) == ("mgmt0", "10.66.101.11",
                                                                  "explicit")


def test_a_named_interface_that_does_not_exist_is_an_error_listing_the_others():
    chosen = select("10.67.101.10", "eth7", ifaces=TWO_NETWORKS)
    assert chosen["name"] is None
    assert "no interface eth7" in chosen["error"] and "ib0 10.67.101.11" in chosen["error"]


def test_a_named_interface_without_an_address_of_the_family():
    chosen = select("10.67.101.10", "v6only", ifaces={"v6only": ["fd00::5"]})
    assert "no IPv4 address" in chosen["error"]


def test_no_route_names_the_routes(monkeypatch):
    monkeypatch.setattr(_netpath, "route_to",
                        lambda address: (None, "RTNETLINK answers: Network is unreachable"))
    monkeypatch.setattr(_netpath, "routes", lambda: ["10.66.101.0/24 dev mgmt0"])
    chosen = select("10.99.0.1", ifaces=TWO_NETWORKS)
    assert chosen["name"] is None and "Network is unreachable" in chosen["error"]
    assert "10.66.101.0/24 dev mgmt0" in chosen["error"]


def test_a_name_that_does_not_resolve():
    chosen = select("no-such-host.invalid", ifaces=TWO_NETWORKS)
    assert chosen["master"] is None and "does not resolve" in chosen["error"]


@pytest.mark.parametrize("address", ["127.0.0.1", "127.0.0.2"])
def test_route_to_on_this_machine(address):
    found, error = _netpath.route_to(address)
    assert error is None and found[0] == "lo"


def test_without_iproute2_the_kernel_still_answers(monkeypatch):
    monkeypatch.setattr(_netpath, "_ip_json", lambda argv: (None, "ip: [Errno 2] No such file"))
    assert "127.0.0.1" in interfaces().get("lo", [])
    found, error = _netpath.route_to("127.0.0.1")
    assert error is None and found == ("lo", "127.0.0.1")
