import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall.common import (
    Spec,
    parse_ports,
    split_addresses,
)


@pytest.fixture
def spec():
    """Spec(run_id, mode, ports, peers), by default from peers of both IP versions, a
    network among them."""
    peers = split_addresses(["10.0.0.3", "10.0.0.2", "fd00::0002", "10.1.0.0/16", "10.0.0.2/32"])

    def make(run_id="run-1", mode="members", ports=(), peers=peers):
        return Spec(run_id, peers[0], peers[1], mode, parse_ports(ports))
    return make
