"""The sync's files and bytes, read from a real rsync's --stats output (plugins/action/rsync.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ansible_collections.torchherd.cluster.plugins.action.rsync import outcome

pytestmark = pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed")


def sync(src: Path, dest: Path) -> str:
    return subprocess.run(["rsync", "-rlptD", "--itemize-changes", "--out-format=%i %n%L",
                           "--stats", f"{src}/", f"{dest}/"],
                          check=True, capture_output=True, text=True).stdout


def test_stats_count_what_was_sent_and_are_no_change(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()  # as the action makes it
    (src / "big.bin").write_bytes(b"\1" * 200_000)
    (src / "Number of files: 7").write_text("a name like a stats line\n")
    changes, files, sent = outcome(sync(src, dest), "push")
    # The root directory's line comes only where its time differs from the new one.
    names = [c.split(" ", 1)[1] for c in changes if not c.endswith(" ./")]
    assert names == ["Number of files: 7", "big.bin"]
    assert files == 2 and sent > 200_000
    changes, files, sent = outcome(sync(src, dest), "push")
    assert changes == [] and files == 0 and sent < 1000
