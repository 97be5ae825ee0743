"""SSH connections kept between runs: a launch reuses each node's connection that an earlier
run opened (ssh's ControlPersist master on the controller) instead of a new handshake, and
`torchherd disconnect` closes them at once. From a project directory without an ansible.cfg,
so that the driver's own SSH settings hold (driver.runner.OWN_SSH_ARGS), on the shared
container cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.integration.helpers import EXAMPLES, wait_for


def _masters(cpdir) -> list[int]:
    """The pids of the SSH connection masters under the test's own ControlPath directory."""
    found = subprocess.run(["pgrep", "-f", f"ssh: {cpdir}/"], capture_output=True, text=True,
                           check=False).stdout.split()
    return sorted(map(int, found))


def test_a_relaunch_reuses_the_kept_connections_and_disconnect_closes_them(
        cluster3, own_masters, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ANSIBLE_CONFIG", "ANSIBLE_SSH_ARGS")}

    def driver(*args):
        return subprocess.run([sys.executable, "-m", "driver", *map(str, args)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300, check=False)

    # Any run opens them: here ps (one task per node), then a launch goes through them.
    asked = driver("ps", "-i", cluster3.inventory)
    assert asked.returncode == 0, asked.stderr
    kept = _masters(own_masters)
    assert len(kept) == len(cluster3.nodes), kept  # one connection per node, kept open
    launched = driver("launch", "-i", cluster3.inventory, "--code-src", EXAMPLES, "--runs-dir",
                      tmp_path / "runs", "--nproc-per-node", "1", "--", "allreduce.py")
    assert launched.returncode == 0, launched.stderr
    assert _masters(own_masters) == kept  # the launch went through the same connections

    gone = driver("disconnect", "-i", cluster3.inventory, "--json")
    assert gone.returncode == 0, gone.stderr
    document = json.loads(gone.stdout)
    assert (document["action"], document["exit_name"]) == ("disconnect", "ok")
    wait_for(lambda: not _masters(own_masters), 15, "the kept connections to close")
