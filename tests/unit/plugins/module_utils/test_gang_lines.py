"""Every node's last line of the job over the gang's links: real sockets and node logs on this
machine, the master's hand-over (its record's gang lines) recorded."""

from __future__ import annotations

import itertools
import threading
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._gang import (
    LINE_EVERY,
    WORD_BYTES,
    Master,
    Member,
    line_heard,
    line_word,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._probe import bind


class Stops:
    def __init__(self):
        self.why = []

    def __call__(self, why):
        self.why.append(why)


class Handed:
    """The master's hand-overs (what it writes into its record): each with its time."""

    def __init__(self):
        self.times, self.nodes = [], []
        self.lock = threading.Lock()

    def __call__(self, nodes):
        with self.lock:
            self.times.append(time.monotonic())
            self.nodes.append(nodes)

    def latest(self):
        with self.lock:
            return {name: said["last_line"] for name, said in (self.nodes or [{}])[-1].items()}


def until(check, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def gang(tmp_path, members=2):
    sock, error = bind(0)
    assert sock is not None, error
    handed, stops = Handed(), [Stops() for _ in range(members + 1)]
    master = Master(sock, members, 10, stops[0], lines=handed)
    logs = [tmp_path / f"n{i}.log" for i in range(members + 1)]
    for log in logs:
        log.write_text("torchherd: started\n")
    master.follow(str(logs[0]), "n0")
    nodes = [Member("127.0.0.1", sock.getsockname()[1], None, 3, stops[i + 1], f"n{i + 1}")
             for i in range(members)]
    for node, log in zip(nodes, logs[1:], strict=True):
        node.follow(str(log))
    assert until(lambda: len(master.links) == members)
    return master, nodes, logs, handed, stops


def say(log, text):
    with open(log, "a", encoding="utf-8") as out:
        out.write(text + "\n")


def test_every_nodes_last_line_reaches_the_masters_record_within_two_seconds(tmp_path):
    master, nodes, logs, handed, stops = gang(tmp_path)
    began = time.monotonic()
    for i, log in enumerate(logs):
        say(log, f"[default0]:step 1 on n{i}")
        say(log, "[default0]:/t.py:3: UserWarning: not the job's words")
    expected = {f"n{i}": f"[default0]:step 1 on n{i}" for i in range(3)}
    assert until(lambda: handed.latest() == expected)
    assert time.monotonic() - began < 2.0
    # Each hand-over names when the master heard each line (its clock).
    assert all(abs(said["at"] - time.time()) < 5 for said in handed.nodes[-1].values())
    for node in nodes:
        node.own_exit(0)
    master.own_exit(0, "n0", linger=5)
    assert [s.why for s in stops] == [[], [], []]


def test_lines_go_at_the_nodes_pace_and_the_last_words_go_at_the_end(tmp_path):
    """A node that prints 50 lines a second says one a second; the master hands them on at
    most once a second; the job's last words, printed just before its end, arrive all the
    same, and the master's last hand-over has them."""
    master, nodes, logs, handed, _stops = gang(tmp_path, members=1)
    heard = []
    line = master.line
    master.line = lambda name, text: (heard.append(text) if name == "n1" else None,
                                      line(name, text))
    began = time.monotonic()
    for step in range(150):
        say(logs[1], f"[default0]:step {step}")
        time.sleep(0.02)
    took = time.monotonic() - began
    assert len(heard) <= took / LINE_EVERY + 2, (len(heard), took)
    gaps = [b - a for a, b in itertools.pairwise(handed.times)]
    assert gaps and min(gaps) >= LINE_EVERY * 0.9, gaps
    say(logs[1], "[default0]:done, loss 0.01")
    say(logs[0], "[default0]:master done")
    nodes[0].own_exit(0)
    master.own_exit(0, "n0", linger=5)
    assert handed.latest() == {"n0": "[default0]:master done", "n1": "[default0]:done, loss 0.01"}


def test_a_line_fits_one_read_of_the_link_and_stops_nobody_whatever_it_says(tmp_path):
    """A long line is cut to fit the link's reads (never inside a character); a line that
    reads like the gang's own words (exit, stop) is a line, not a word of the gang."""
    word = line_word("n1", "é" * 400)
    assert len(word.encode()) <= WORD_BYTES - 1 and word.startswith("line n1 éé")
    assert line_word("n1", "a\tb\r\nc") == "line n1 a b c"
    assert line_heard("n1", "a\tb") == "a b" and line_heard("n1", "") == ""
    master, nodes, logs, handed, stops = gang(tmp_path)
    say(logs[1], "exit 3 " + "x" * 1000)
    say(logs[2], "stop")
    assert until(lambda: set(handed.latest()) == {"n1", "n2"})
    assert handed.latest()["n1"].startswith("exit 3 xxx") and handed.latest()["n2"] == "stop"
    assert [s.why for s in stops] == [[], [], []]
    # And the gang still stops everyone on the first failure, lines flowing or not.
    nodes[0].own_exit(1)
    assert until(lambda: stops[0].why and stops[2].why)
    assert stops[0].why == ["n1 ended with exit code 1"] == stops[2].why
    nodes[1].own_exit(-15)
    master.own_exit(-15, "n0", linger=5)


def test_a_gang_that_says_no_line_hands_nothing_on(tmp_path):
    """A job that printed nothing of its own (the supervisor's lines are not the job's) leaves
    the master's record without lines; a master without a hand-over follows no log."""
    master, nodes, _logs, handed, _stops = gang(tmp_path, members=1)
    time.sleep(0.6)
    nodes[0].own_exit(0)
    master.own_exit(0, "n0", linger=5)
    assert handed.nodes == []
    sock, _error = bind(0)
    quiet = Master(sock, 0, 0.1, Stops())
    quiet.follow(str(tmp_path / "n0.log"), "n0")
    assert quiet.follower is None
    quiet.own_exit(0, "n0", linger=1)


def test_every_nodes_use_reaches_the_masters_record_and_an_idle_node_is_named(tmp_path,
                                                                            monkeypatch):
    """Each node's last sample ("UTIL CELL") rides its link beside its line; a node whose GPUs
    sit idle while another's work is handed on with its idle spell once that lasted
    IDLE_AFTER s; a cell that reads like a word of the gang stops nobody."""
    from ansible_collections.torchherd.cluster.plugins.module_utils import _gang
    monkeypatch.setattr(_gang, "IDLE_AFTER", 1.0)
    sock, error = bind(0)
    assert sock is not None, error
    handed, stops = Handed(), [Stops(), Stops()]
    master = Master(sock, 1, 10, stops[0], lines=handed)
    logs = [tmp_path / "n0.log", tmp_path / "n1.log"]
    for log in logs:
        log.write_text("torchherd: started\n")
    said = {"n0": "97 gpu 97% 39.3G", "n1": "- cpu 42% 3.0G"}
    master.follow(str(logs[0]), "n0", use=lambda: said["n0"])
    node = Member("127.0.0.1", sock.getsockname()[1], None, 3, stops[1], "n1")
    node.follow(str(logs[1]), use=lambda: said["n1"])
    assert until(lambda: len(master.links) == 1)

    def last():
        with handed.lock:
            return (handed.nodes or [{}])[-1]

    def uses():
        return {name: entry.get("use") for name, entry in last().items()}

    assert until(lambda: uses() == {"n0": "gpu 97% 39.3G", "n1": "cpu 42% 3.0G"}, 5.0), uses()
    assert "idle_for" not in last()["n1"]  # no GPUs: never idle
    said["n1"] = "0 gpu 0% 1.0G"
    assert until(lambda: last().get("n1", {}).get("idle_for", 0) >= 1.0, 8.0), last()
    assert "idle_for" not in last()["n0"]
    said["n1"] = "95 stop everything"
    assert until(lambda: uses().get("n1") == "stop everything", 5.0), uses()
    assert until(lambda: "idle_for" not in last()["n1"], 5.0), last()
    say(logs[1], "step 1")
    assert until(lambda: handed.latest().get("n1") == "step 1", 5.0)
    assert uses()["n1"] == "stop everything"  # a line keeps the node's use
    node.own_exit(0)
    master.own_exit(0, "n0", linger=5)
    assert stops[0].why == [] and stops[1].why == []
