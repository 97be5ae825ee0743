"""driver.pipes: what passes through its pipes reaches the other end and no file, and an end
that never comes leaves no thread waiting nor pipe behind."""

from __future__ import annotations

import json
import os
import stat
import threading
import time

from driver.pipes import drained, handed_over


def test_the_reader_gets_the_data_and_the_pipe_goes(tmp_path):
    with handed_over(tmp_path / "vars", {"secret_env": {"A": "value"}}) as path:
        assert stat.S_ISFIFO(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert json.loads(path.read_text()) == {"secret_env": {"A": "value"}}
    assert not path.exists()


def test_what_is_written_is_dropped(tmp_path):
    path = tmp_path / "artifacts" / "x" / "command"
    with drained(path), open(path, "w", encoding="utf-8") as writer:
        writer.write("environment " * 100_000)  # more than a pipe's buffer
    assert not path.exists() and not list((tmp_path / "artifacts" / "x").iterdir())


def test_an_end_that_never_comes_leaves_nothing_waiting(tmp_path):
    before = threading.active_count()
    started = time.monotonic()
    with handed_over(tmp_path / "unread", {"a": 1}), drained(tmp_path / "unwritten"):
        pass
    assert time.monotonic() - started < 2
    assert threading.active_count() == before
    assert os.listdir(tmp_path) == []
