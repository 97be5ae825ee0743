"""The gang on the nodes: real sockets on this machine, the stops recorded."""

from __future__ import annotations

import threading
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._gang import Master, Member
from ansible_collections.torchherd.cluster.plugins.module_utils._probe import bind


class Stops:
    """A node's stop: records why, once."""

    def __init__(self):
        self.why = []
        self.event = threading.Event()

    def __call__(self, why):
        self.why.append(why)
        self.event.set()


def gang(members=2, elastic=False):
    sock, error = bind(0)
    assert sock is not None, error
    port = sock.getsockname()[1]
    master_stop = Stops()
    master = Master(sock, members, 10, master_stop, elastic)
    stops = [Stops() for _ in range(members)]
    nodes = [Member("127.0.0.1", port, None, 3, stops[i], f"n{i + 1}", elastic)
             for i in range(members)]
    deadline = time.monotonic() + 5
    while len(master.links) < members and time.monotonic() < deadline:
        time.sleep(0.01)
    return master, master_stop, nodes, stops


def test_a_failing_node_stops_every_other_node_and_the_master():
    master, master_stop, nodes, stops = gang()
    nodes[0].own_exit(1)
    assert master_stop.event.wait(5) and stops[1].event.wait(5)
    assert master_stop.why == ["n1 ended with exit code 1"]
    assert stops[1].why == ["n1 ended with exit code 1"] and stops[0].why == []
    nodes[1].own_exit(-15)
    master.own_exit(-15, "n0", linger=5)


def test_the_master_failing_stops_every_node():
    master, master_stop, nodes, stops = gang()
    done = threading.Thread(target=master.own_exit, args=(1, "n0"), kwargs={"linger": 5})
    done.start()
    assert all(s.event.wait(5) for s in stops)
    assert stops[0].why == ["n0 ended with exit code 1"]
    for node in nodes:
        node.own_exit(-15)
    done.join(10)
    assert not done.is_alive() and master_stop.why == ["n0 ended with exit code 1"]


def test_everyone_succeeding_stops_nobody():
    master, master_stop, nodes, stops = gang()
    for node in nodes:
        node.own_exit(0)
    master.own_exit(0, "n0", linger=5)
    time.sleep(0.2)
    assert master_stop.why == [] and [s.why for s in stops] == [[], []]


def test_a_node_lost_without_a_word_stops_a_static_gang_not_an_elastic_one():
    for elastic, expected in ((False, True), (True, False)):
        master, master_stop, nodes, stops = gang(elastic=elastic)
        nodes[0].link.close()  # the node died: its link closed without an exit
        assert master_stop.event.wait(1 if elastic else 5) is expected
        assert stops[1].event.wait(0.5 if elastic else 5) is expected
        nodes[1].own_exit(0 if elastic else -15)
        master.own_exit(0, "n0", linger=2)
        # The master names the node it lost (its first word on the link was its name).
        assert master.lost == ["n1"] and list(master.lost_at) == ["n1"]
        assert abs(master.lost_at["n1"] - time.time()) < 30
        if not elastic:
            assert master_stop.why[0].startswith("n1 at ") and "was lost" in master_stop.why[0]


def test_the_masters_bye_after_success_is_no_loss():
    master, master_stop, nodes, stops = gang(members=1)
    # The master's job ends first and well; it leaves once the node's link... or its linger.
    leaving = threading.Thread(target=master.own_exit, args=(0, "n0"), kwargs={"linger": 0.2})
    leaving.start()
    leaving.join(5)
    time.sleep(0.2)
    assert stops[0].why == []
    nodes[0].own_exit(0)


def test_the_master_says_whether_every_node_joined_and_stays_for_them_all():
    """formed(joined, expected) once no more links are taken; own_exit returns only once every
    joined node's link closed (their launchers ended), however long that takes."""
    said = []
    sock, error = bind(0)
    assert sock is not None, error
    port = sock.getsockname()[1]
    master = Master(sock, 2, 1.0, Stops(), formed=lambda *counts: said.append(counts))
    node = Member("127.0.0.1", port, None, 3, Stops(), "n1")
    leaving = threading.Thread(target=master.own_exit, args=(0, "n0"))
    leaving.start()
    master.accepter.join(10)  # the accept window is over: one of two joined
    assert said == [(1, 2)]
    leaving.join(0.5)
    assert leaving.is_alive()  # its job still runs: the master stays
    node.own_exit(0)
    leaving.join(5)
    assert not leaving.is_alive()

    said.clear()
    sock, error = bind(0)
    port = sock.getsockname()[1]
    master = Master(sock, 2, 10, Stops(), formed=lambda *counts: said.append(counts))
    nodes = [Member("127.0.0.1", port, None, 3, Stops(), f"n{i}") for i in (1, 2)]
    master.accepter.join(5)  # both joined: no need to wait out the window
    assert said == [(2, 2)]
    for node in nodes:
        node.own_exit(0)
    master.own_exit(0, "n0", linger=5)
