"""What a user sees on a terminal while a launch runs: a real launch on the embedded default
(inventories/local.ini) inside tmux, 120x30, its screen read with capture-pane while the job
prints. The live table must show each node's elapsed time and the job's own last line, not
only the phase it started in.

Without tmux this is skipped, unless TORCHHERD_REQUIRE_CLUSTER=1 (CI), where it fails: a
missing tool must not pass the run silently (scripts/install-system-deps.sh installs it).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from tests.integration.helpers import EXAMPLES, REPO
from tests.integration.local_nodes import LOCAL_INI

# A row of the live table while the job runs: node, rank, phase, state, elapsed, last line.
RUNNING_ROW = re.compile(r"node\d\s.*\brunning\b\s.*?\b(\d+s|\d+m\d\ds)\b.*"
                         r"r\d: ticker rank \d/\d: tick \d+/\d+")


@pytest.fixture
def tmux():
    if shutil.which("tmux") is None:
        reason = "tmux is not installed (run scripts/install-system-deps.sh)"
        if os.environ.get("TORCHHERD_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"TORCHHERD_REQUIRE_CLUSTER=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    # A server of its own (socket name), without the user's configuration.
    socket = f"torchherd-test-{uuid.uuid4().hex[:8]}"

    def run(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket, "-f", os.devnull, *args], check=True,
                              capture_output=True, text=True, timeout=30).stdout

    yield run
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False,
                   timeout=30)


def test_the_live_table_shows_elapsed_time_and_the_jobs_last_line(tmux, tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(EXAMPLES / "ticker.py", code)
    argv = [sys.executable, "-m", "driver", "launch", "-i", str(LOCAL_INI),
            "--code-src", str(code), "--nproc-per-node", "1",
            "--runs-dir", str(tmp_path / "runs"), "--", "ticker.py", "--seconds", "8"]
    # remain-on-exit: the pane (and the final report in it) stays after the driver exits. The
    # exit code is printed by a shell around it: tmux's pane_dead_status may stay empty where
    # the pane's terminal closed before tmux reaped the process.
    tmux("new-session", "-d", "-x", "120", "-y", "30", "-s", "th", "-c", str(REPO),
         "sh", "-c", '"$@"; echo "driver-exit=$?"', "sh", *argv,
         ";", "set-option", "-t", "th", "remain-on-exit", "on")
    screens: list[str] = []
    seen = None
    # Polled, not slept: on a busy machine the launch and the watch's rounds come late.
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", "th")
        screens.append(screen)
        seen = seen or next((line for line in screen.splitlines()
                             if RUNNING_ROW.search(line)), None)
        if tmux("display-message", "-p", "-t", "th", "#{pane_dead}").strip() == "1":
            break
        time.sleep(0.3)
    final = tmux("capture-pane", "-p", "-t", "th")
    assert "driver-exit=0" in final, final
    assert re.search(r"run \S+ succeeded", final), final
    table = [s for s in screens if "torchherd launch" in s and "watch" in s]
    assert seen, ("no screen showed a running node's elapsed time and the job's last line:\n"
                  + (table[-1] if table else screens[-1] if screens else ""))
    # The title counts the whole run's time too.
    assert any(re.search(r"torchherd launch \S+: watch\s+\d+s", s) for s in table), table[-1:]
