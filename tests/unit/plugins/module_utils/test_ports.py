"""The master port on real sockets: checked free, or picked free (master_port auto)."""

import socket

from ansible_collections.torchherd.cluster.plugins.module_utils._ports import (
    bind,
    pick_free,
    port_free,
)


def test_a_picked_port_is_free_and_a_server_can_listen_on_it():
    port = pick_free()
    assert 1024 <= port <= 65535 and port_free(port)
    sock, why = bind(port)
    assert why is None
    with sock:
        assert not port_free(port)


def test_a_port_in_use_is_not_free_and_never_picked():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        taken = busy.getsockname()[1]
        assert not port_free(taken)
        assert {pick_free() for _ in range(20)}.isdisjoint({taken, None})
