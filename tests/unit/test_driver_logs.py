"""Node log lines named by host and global rank (driver.logs)."""

from driver.logs import LogTail, parse_line, static_nproc


def test_worker_lines_get_the_global_rank():
    line = parse_line("node1", 1, 2, "[default1]:loss 0.5")
    assert (line.rank, line.local_rank, line.text) == (3, 1, "loss 0.5")
    assert str(line) == "node1 r3: loss 0.5" and line.short == "r3: loss 0.5"


def test_torch_rank_prefix_is_dropped_when_it_repeats_the_rank():
    assert str(parse_line("n0", 0, 2, "[default1]:[rank1]: Traceback")) == "n0 r1: Traceback"
    # Not the same rank (nproc mismatch): keep what torch said.
    assert parse_line("n0", 0, 2, "[default1]:[rank5]: x").text == "[rank5]: x"


def test_torchrun_lines_and_elastic_ranks():
    agent = parse_line("n0", 0, 2, "W1121 torchrun warning")
    assert str(agent) == "n0 agent: W1121 torchrun warning" and agent.short == agent.text
    assert str(parse_line("n2", 2, None, "[default0]:hi")) == "n2 l0: hi"


def test_static_nproc_from_gate_or_plan():
    plan = {"nproc_per_node": "auto", "job": {"rdzv": "static"}}
    assert static_nproc(plan, {"gate": {"nproc_per_node": 4}}) == 4
    assert static_nproc({"nproc_per_node": 2, "job": {}}, None) == 2
    assert static_nproc(plan, None) is None
    assert static_nproc({"nproc_per_node": 2, "job": {"rdzv": "c10d"}}, None) is None


def test_tail_returns_whole_lines_once_and_survives_replacement(tmp_path):
    log = tmp_path / "node.log"
    log.write_bytes(b"a\nb\npart")
    tail = LogTail(log)
    assert tail.read() == ["a", "b"]
    assert tail.read() == []
    # rsync writes a new copy with more content.
    replacement = tmp_path / "new"
    replacement.write_bytes(b"a\nb\npartial line\nc\n")
    replacement.replace(log)
    assert tail.read() == ["partial line", "c"]
    log.write_bytes(b"a\nb\npartial line\nc\nend")
    assert tail.read(final=True) == ["end"]
    assert LogTail(tmp_path / "absent").read() == []
