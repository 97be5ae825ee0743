"""The hang watch across nodes: a job is hung once every node is quiet and the newest progress
of any is hang_timeout old; one node declares it, the others learn it."""

from __future__ import annotations

import json
import time

from ansible_collections.torchherd.cluster.plugins.action.torchrun_job import HangWatch

HOSTS = ["n0", "n1", "n2"]


def answer(last, quiet, hung=False, state="running"):
    """A node's wait as the module answers it (its clock equal to the controller's)."""
    return {"job_state": state, "checked_at": time.time(),
            "activity": {"last": last, "quiet": quiet, "hung": hung}}


def test_a_quiet_node_alone_is_not_a_hang(tmp_path):
    now = time.time()
    watch = HangWatch(str(tmp_path), HOSTS, 10, "n1")
    assert watch.quiet_since() == 0
    result = watch.judge(answer(now - 12, True))
    assert result["hang_state"] == "quiet" and "hang_declared" not in result
    # The next wait on n1 returns only on progress after that quiet spell.
    assert abs(watch.quiet_since() - (now - 12)) < 0.01


def test_every_node_quiet_long_enough_is_declared_once(tmp_path):
    now = time.time()
    for host in ("n0", "n1"):
        HangWatch(str(tmp_path), HOSTS, 10, host).judge(answer(now - 11, True))
    last = HangWatch(str(tmp_path), HOSTS, 10, "n2").judge(answer(now - 10.5, True))
    assert last["hang_state"] == "hung" and last["hang_declared"] is True
    declared = json.loads((tmp_path / "hung.json").read_text())
    assert declared["declared_by"] == "n2" and 10 <= declared["quiet_for"] < 12
    # Another node's wait that returns afterwards learns it, without declaring it again.
    other = HangWatch(str(tmp_path), HOSTS, 10, "n0").judge(answer(now - 11, True))
    assert other["hang_state"] == "hung" and not other.get("hang_declared")


def test_a_node_active_again_keeps_the_job_alive(tmp_path):
    now = time.time()
    HangWatch(str(tmp_path), HOSTS, 10, "n0").judge(answer(now - 20, True))
    HangWatch(str(tmp_path), HOSTS, 10, "n1").judge(answer(now - 1, False))  # rank 1 prints
    result = HangWatch(str(tmp_path), HOSTS, 10, "n2").judge(answer(now - 15, True))
    assert result["hang_state"] == "quiet" and not (tmp_path / "hung.json").exists()


def test_a_node_whose_job_ended_counts_as_quiet_but_declares_nothing(tmp_path):
    now = time.time()
    ended = HangWatch(str(tmp_path), HOSTS, 10, "n0").judge(
        answer(now - 30, False, state="succeeded"))
    assert ended["hang_state"] == "quiet" and "hang_declared" not in ended
    for host in ("n1", "n2"):
        result = HangWatch(str(tmp_path), HOSTS, 10, host).judge(answer(now - 12, True))
    assert result["hang_declared"] is True


def test_a_result_without_activity_is_left_alone(tmp_path):
    lost = {"unreachable": True, "lost": True}
    assert HangWatch(str(tmp_path), HOSTS, 10, "n0").judge(dict(lost)) == lost
