"""summary.json logic: root cause, elastic success, per-host merge, failure parsing."""

import json
import os

import pytest

from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import RECORD
from ansible_collections.torchherd.cluster.plugins.plugin_utils._root_cause import (
    failure_kind,
    failure_of,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._summary import (
    newer,
    resolved_plan,
    summarize,
)
from ansible_collections.torchherd.cluster.plugins.plugin_utils._timings import (
    phase_ends,
    phase_timings,
)


def plan(rdzv="static", nnodes="3"):
    return {"run_id": "r", "nnodes": nnodes, "job": {"rdzv": rdzv},
            "nodes": [{"host": f"n{i}", "address": f"10.0.0.{i}", "node_rank": i}
                      for i in range(3)]}


def write_stderr(tmp_path, host, local_rank, text):
    d = tmp_path / "nodes" / host / "torchrun" / "x" / "attempt_0" / str(local_rank)
    d.mkdir(parents=True)
    (d / "stderr.log").write_text(text)


def test_root_cause_is_the_real_exception_not_the_peers_connection_errors(tmp_path):
    write_stderr(tmp_path, "n0", 0, "[rank0]: Traceback (most recent call last):\n"
                 "[rank0]:   File \"t.py\", line 1\n"
                 "[rank0]: RuntimeError: Connection closed by peer [10.0.0.1]:5\n")
    write_stderr(tmp_path, "n1", 1, "[rank3]: Traceback (most recent call last):\n"
                 "[rank3]:   File \"t.py\", line 9\n[rank3]: ValueError: bad batch\n")
    for host, rank, local in (("n0", 0, 0), ("n1", 3, 1)):
        (tmp_path / "nodes" / host / "node.log").write_text(
            f"Root Cause (first observed failure):\n  rank      : {rank} (local_rank: {local})\n")
    results = {"n0": {"job_state": "failed", "exit_code": 1, "ended_at": 10.0},
               "n1": {"job_state": "failed", "exit_code": 1, "ended_at": 11.0},
               "n2": {"job_state": "stopped", "exit_code": -15, "ended_at": 12.0}}
    s = summarize(str(tmp_path), plan(), results, {})
    assert s["state"] == "failed"
    assert s["reason"] == "node n1 (node_rank 1) rank 3: ValueError: bad batch"
    assert s["hosts"]["n1"]["failing_rank"] == 3
    assert s["cause"] == "n1" and s["cause_kind"] == "exception"


def test_lost_node_is_the_root_cause(tmp_path):
    results = {"n0": {"job_state": "failed", "exit_code": 1, "ended_at": 5.0},
               "n1": {"job_state": "running", "unreachable": True,
                      "error": "ssh: connect to host: No route to host"},
               "n2": {"job_state": "stopped", "exit_code": -15}}
    s = summarize(str(tmp_path), plan(), results, {})
    assert s["hosts"]["n1"]["state"] == "lost"
    assert s["reason"].startswith("node n1 (node_rank 1) was lost")
    assert s["cause"] == "n1" and s["cause_kind"] == "node_lost"


@pytest.mark.parametrize(("entry", "kind"), [
    ({"state": "lost"}, "node_lost"),
    ({"state": "unreachable"}, "node_lost"),
    ({"state": "failed", "exception": "RuntimeError: Connection closed by peer [10.0.0.2]:4"},
     "connection"),
    ({"state": "failed", "exception": "torch.distributed.DistNetworkError: failed to recv"},
     "connection"),
    ({"state": "failed", "exception": "killed by SIGKILL (9) without a traceback"}, "signal"),
    ({"state": "failed", "exit_code": 137}, "signal"),
    ({"state": "failed", "exit_code": -9}, "signal"),
    ({"state": "failed", "exception": "ValueError: bad batch", "exit_code": 1}, "exception"),
    # The rank raised; the gang's stop (a peer failed on the lost connection) ended the node's
    # launcher before it ended by itself.
    ({"state": "failed", "exception": "RuntimeError: injected failure on rank 1",
      "exit_code": -15}, "exception"),
    ({"state": "failed", "exception": "KeyboardInterrupt", "exit_code": -2}, "signal"),
    ({"state": "timed_out", "exit_code": 1}, "exception"),
])
def test_failure_kinds(entry, kind):
    assert failure_kind(entry) == kind


def test_elastic_run_that_lost_a_node_but_finished_succeeds(tmp_path):
    results = {"n0": {"job_state": "succeeded", "exit_code": 0},
               "n1": {"job_state": "succeeded", "exit_code": 0},
               "n2": {"unreachable": True}}
    s = summarize(str(tmp_path), plan("c10d", "2:3"), results, {})
    assert s["state"] == "succeeded" and "n2" in s["reason"]
    # Below the minimum it is a failure.
    results["n1"] = {"unreachable": True}
    assert summarize(str(tmp_path), plan("c10d", "3:3"), results, {})["state"] == "failed"


def test_a_later_report_wins_per_host():
    stopped = {"state": "stopped", "checked_at": 20.0}
    stale = {"state": "running", "checked_at": 10.0}
    assert newer(stopped, stale) is stopped
    assert newer(stale, stopped) is stopped
    assert newer(None, stale) is stale
    # A node that does not answer now was lost since it was seen running, not since it ended.
    gone = {"state": "lost", "unreachable": True, "checked_at": None}
    assert newer(stale, gone) is gone
    assert newer(stopped, gone) is stopped


def test_error_file_gives_the_exception(tmp_path):
    d = tmp_path / "torchrun" / "x" / "attempt_0" / "1"
    d.mkdir(parents=True)
    (d / "error.json").write_text('{"message": {"message": "KeyError: \'lr\'", '
                                  '"extraInfo": {"py_callstack": "Traceback ..."}}}')
    found = failure_of(str(tmp_path))
    assert found["exception"] == "KeyError: 'lr'" and found["local_rank"] == 1
    assert found["traceback"] == "Traceback ..."


# One failed rank in torchrun's report of a node.
FAILURE = """[{index}]:
  time      : 2026-11-23_13:09:05
  host      : n1
  rank      : {rank} (local_rank: {local})
  exitcode  : {code} (pid: {pid})
  error_file: <N/A>
"""


def failed_report(other, other_local, other_code, root, root_local, root_code):
    """torchrun's report of two failed ranks of node n1: `other`, then the root cause `root`."""
    rule = "-" * 60 + "\n"
    return ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            + "=" * 60 + "\nt.py FAILED\n" + rule + "Failures:\n"
            + FAILURE.format(index=1, rank=other, local=other_local, code=other_code, pid=406)
            + rule + "Root Cause (first observed failure):\n"
            + FAILURE.format(index=0, rank=root, local=root_local, code=root_code, pid=405)
            + "=" * 60 + "\n")


def two_rank_node(tmp_path, logs, report, attempt=0):
    """Node n1 with ranks 2 (local 0) and 3 (local 1): logs is {local: (text, mtime)}."""
    node = tmp_path / "n1"
    for local, (text, mtime) in logs.items():
        d = node / "torchrun" / "x" / f"attempt_{attempt}" / str(local)
        d.mkdir(parents=True)
        (d / "stderr.log").write_text(text)
        os.utime(d / "stderr.log", (mtime, mtime))
    (node / "node.log").write_text(report)
    return str(node)


def tb(rank, line):
    return (f"[rank{rank}]: Traceback (most recent call last):\n"
            f"[rank{rank}]:   File \"t.py\", line 9\n[rank{rank}]: {line}\n")


def test_torchruns_tied_root_cause_is_not_taken_for_the_rank_that_raised(tmp_path):
    # Both ranks died between two of torchrun's polls: its report names local rank 0, whose
    # error is the lost connection to rank 3, which raised first.
    report = failed_report(other=3, other_local=1, other_code=1, root=2, root_local=0, root_code=1)
    node = two_rank_node(tmp_path, {0: (tb(2, "RuntimeError: Connection closed by peer"), 101.0),
                                    1: (tb(3, "ValueError: injected"), 100.0)}, report)
    found = failure_of(node)
    assert (found["failing_rank"], found["local_rank"]) == (3, 1)
    assert found["exception"] == "ValueError: injected"


def test_of_two_real_exceptions_the_earlier_is_the_root_cause(tmp_path):
    report = failed_report(other=3, other_local=1, other_code=1, root=2, root_local=0, root_code=1)
    logs = {0: (tb(2, "KeyError: 'a'"), 100.0), 1: (tb(3, "KeyError: 'b'"), 100.5)}
    assert failure_of(two_rank_node(tmp_path / "a", logs, report))["failing_rank"] == 2
    logs = {0: (tb(2, "KeyError: 'a'"), 100.5), 1: (tb(3, "KeyError: 'b'"), 100.0)}
    assert failure_of(two_rank_node(tmp_path / "b", logs, report))["failing_rank"] == 3


def test_a_rank_killed_by_a_signal_is_not_the_root_cause(tmp_path):
    # torchrun names the rank it killed itself after the other one failed.
    report = failed_report(other=3, other_local=1, other_code=1, root=2, root_local=0,
                           root_code=-15)
    node = two_rank_node(tmp_path, {0: ("Signal 15 received\n", 99.0),
                                    1: (tb(3, "OSError: disk full"), 100.0)}, report)
    found = failure_of(node)
    assert found["failing_rank"] == 3 and found["exception"] == "OSError: disk full"
    # A rank the kernel killed (out of memory) is a failure of its own, before one torchrun
    # terminated after it.
    report = failed_report(other=2, other_local=0, other_code=-15, root=3, root_local=1,
                           root_code=-9)
    node = two_rank_node(tmp_path / "oom", {0: ("Signal 15 received\n", 99.0),
                                            1: ("loading batch\n", 98.0)}, report)
    assert failure_of(node)["failing_rank"] == 3


def test_without_torchruns_report_the_rank_comes_from_the_prefix(tmp_path):
    # torchrun was ended before it wrote its report (the supervisor ends it 2 s after a rank
    # failed): the rank that raised, by its error and torch's [rankN]: prefix.
    node = two_rank_node(tmp_path, {0: ("Signal 15 received\n", 99.0),
                                    1: (tb(3, "ValueError: injected"), 100.0)}, "")
    found = failure_of(node)
    assert (found["failing_rank"], found["local_rank"]) == (3, 1)
    assert found["exception"] == "ValueError: injected"


def stopped_at(node_dir, at):
    """A collected node directory whose run record says when a stop began (the `stopped`
    marker repeats it; the root cause reads the record)."""
    (node_dir / RECORD).write_text(json.dumps({"job": {"stopped_at": at}}))


def test_a_node_whose_rank_raised_before_the_stop_reached_it_failed(tmp_path):
    # n1's rank 3 raised; n0's rank failed on the lost connection and was heard first, so the
    # gang stopped n1 after its rank had raised.
    write_stderr(tmp_path, "n0", 0, tb(0, "RuntimeError: Connection closed by peer [10.0.0.1]:5"))
    write_stderr(tmp_path, "n1", 1, tb(3, "ValueError: injected failure on rank 3"))
    rank3 = tmp_path / "nodes" / "n1" / "torchrun" / "x" / "attempt_0" / "1" / "stderr.log"
    os.utime(rank3, (100.0, 100.0))
    stopped_at(tmp_path / "nodes" / "n1", 101.0)
    (tmp_path / "nodes" / "n2").mkdir(parents=True)
    stopped_at(tmp_path / "nodes" / "n2", 101.0)
    results = {"n0": {"job_state": "failed", "exit_code": 1, "ended_at": 10.0},
               "n1": {"job_state": "stopped", "exit_code": -9, "ended_at": 11.0},
               "n2": {"job_state": "stopped", "exit_code": -15, "ended_at": 12.0}}
    s = summarize(str(tmp_path), plan(), results, {})
    assert s["hosts"]["n1"]["state"] == "failed" and s["hosts"]["n2"]["state"] == "stopped"
    assert s["reason"].startswith("node n1 (node_rank 1) rank 3: ValueError: injected")
    # A rank that raised only after the stop (its own handler) leaves the node stopped.
    stopped_at(tmp_path / "nodes" / "n1", 99.0)
    s = summarize(str(tmp_path), plan(), results, {})
    assert s["hosts"]["n1"]["state"] == "stopped"


def test_the_last_attempt_of_a_restarted_job_counts(tmp_path):
    report = failed_report(other=3, other_local=1, other_code=1, root=2, root_local=0, root_code=1)
    node = two_rank_node(tmp_path, {0: (tb(2, "ValueError: first try"), 50.0)}, report, attempt=0)
    d = tmp_path / "n1" / "torchrun" / "x" / "attempt_1"
    for local, line, mtime in ((0, "RuntimeError: Connection reset by peer", 201.0),
                               (1, "ValueError: second try", 200.0)):
        (d / str(local)).mkdir(parents=True)
        (d / str(local) / "stderr.log").write_text(tb(2 + local, line))
        os.utime(d / str(local) / "stderr.log", (mtime, mtime))
    found = failure_of(node)
    assert found["failing_rank"] == 3 and found["exception"] == "ValueError: second try"


DEEPSPEED_NODE_LOG = """\
[2026-11-24 03:31:30,001] [INFO] [launch.py:170:main] dist_world_size=6
torchherd-fail rank=3 t=1795491091.928
[rank3]: Traceback (most recent call last):
[rank3]:   File "/code/deepspeed_step.py", line 56, in main
[rank3]:     raise RuntimeError(f"injected failure on rank {rank}")
[rank3]: RuntimeError: injected failure on rank 3
[rank2]: Traceback (most recent call last):
[rank2]:   File "/code/deepspeed_step.py", line 58, in main
[rank2]:     dist.all_reduce(value)
[rank2]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:51082
[2026-11-24 03:31:33,606] [ERROR] [launch.py:259:sigkill_handler] ['/usr/bin/python3', '-u', \
'deepspeed_step.py', '--local_rank=1'] exits with return code = 1
"""


def test_a_launcher_without_per_rank_files_names_the_rank_from_the_prefixes(tmp_path):
    """DeepSpeed's launcher writes every rank to the node log; the rank that raised by itself
    is named, not the peer that lost its connection after it (which wrote last)."""
    from ansible_collections.torchherd.cluster.plugins.plugin_utils._root_cause import failure_of

    (tmp_path / "node.log").write_text(DEEPSPEED_NODE_LOG)
    found = failure_of(str(tmp_path))
    assert found["failing_rank"] == 3
    assert found["exception"] == "RuntimeError: injected failure on rank 3"
    assert "deepspeed_step.py\", line 56" in found["traceback"]


def test_a_deepspeed_node_whose_rank_raised_before_the_gangs_stop_failed(tmp_path):
    """DeepSpeed's launcher looks at its ranks once a second: another node's launcher, whose
    ranks failed on the lost connections, can be heard first, and the gang stops this node
    before its launcher saw its own rank's exception. Its rank's traceback stands in the node
    log before the supervisor's "stopping" line: a failure, not a stop."""
    from ansible_collections.torchherd.cluster.plugins.plugin_utils._root_cause import (
        failed_before_stop,
    )

    log = DEEPSPEED_NODE_LOG.split("[2026-11-24 03:31:33")[0]
    stopped_at(tmp_path, 101.0)
    (tmp_path / "node.log").write_text(
        log + "torchherd: stopping: n2 ended with exit code 1\n"
        "[2026-11-24 03:31:33,606] [INFO] [launch.py:262:sigkill_handler] Main process received "
        "SIGTERM, exiting\n")
    assert failed_before_stop(str(tmp_path))
    # The same exception after the stop's line (the stop made it), or only a peer's lost
    # connection before it: stopped.
    (tmp_path / "node.log").write_text("torchherd: stopping: n2 ended with exit code 1\n" + log)
    assert not failed_before_stop(str(tmp_path))
    peer_only = "\n".join(line for line in log.splitlines() if "rank3" not in line)
    (tmp_path / "node.log").write_text(peer_only + "\ntorchherd: stopping: n2 ended\n")
    assert not failed_before_stop(str(tmp_path))


def declare_hang(tmp_path, declared_at, where="rank 3 on n1 in stall (t.py:9)"):
    (tmp_path / "watch").mkdir()
    (tmp_path / "watch" / "hung.json").write_text(
        f'{{"declared_at": {declared_at}, "declared_by": "n0", "timeout": 25, "quiet_for": 26}}')
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "20261124-060951.json").write_text(
        f'{{"summary": "{where}", "odd": [{{"rank": 3, "host": "n1"}}]}}')


def test_a_hung_job_stays_hung_after_the_stop_that_made_its_ranks_fail(tmp_path):
    declare_hang(tmp_path, 100.0)
    results = {"n0": {"job_state": "stopped", "exit_code": -15, "ended_at": 101.0},
               "n1": {"job_state": "stopped", "exit_code": -15, "ended_at": 101.5},
               "n2": {"job_state": "failed", "exit_code": 1, "ended_at": 101.2}}
    s = summarize(str(tmp_path), plan(), results, {})
    assert s["state"] == "hung"
    assert s["reason"].startswith("no progress from any rank for 26 s (hang_timeout 25 s): "
                                  "rank 3 on n1 in stall (t.py:9)")
    assert s["hang"]["stopped"] and s["hang"]["odd"] == [{"rank": 3, "host": "n1"}]
    assert s["hang"]["stacks"].endswith("stacks/20261124-060951.txt")


def test_a_failure_before_the_hang_was_declared_is_the_cause(tmp_path):
    declare_hang(tmp_path, 100.0)
    results = {"n0": {"job_state": "failed", "exit_code": 1, "ended_at": 99.0},
               "n1": {"job_state": "stopped", "exit_code": -15, "ended_at": 101.0},
               "n2": {"job_state": "stopped", "exit_code": -15, "ended_at": 101.0}}
    assert summarize(str(tmp_path), plan(), results, {})["state"] == "failed"


def test_a_kept_hung_job_is_hung_and_running(tmp_path):
    declare_hang(tmp_path, 100.0)
    results = {h: {"job_state": "running"} for h in ("n0", "n1", "n2")}
    s = summarize(str(tmp_path), plan(), results, {})
    assert s["state"] == "hung" and "left running" in s["reason"] and not s["hang"]["stopped"]


def test_a_node_the_watch_did_not_wait_on_is_told_from_its_collected_run_directory(tmp_path):
    """The master's gang spoke for n1 and n2: their results are their starts' (running); their
    end, exit code and last line come from the run directories collect brought back."""
    for host, code, line in (("n1", 0, "rank 1 ok"), ("n2", 3, "rank 2 gave up")):
        d = tmp_path / "nodes" / host
        d.mkdir(parents=True)
        (d / "exit_code").write_text(f"{code}\n")
        (d / "meta.json").write_text('{"started_at": 1.0, "ended_at": 9.0}')
        (d / "node.log").write_text(f"starting\n{line}\n\n")
    results = {"n0": {"job_state": "succeeded", "exit_code": 0, "ended_at": 9.5,
                      "last_line": "rank 0 ok"},
               "n1": {"job_state": "running", "started_at": 1.0},
               "n2": {"job_state": "running", "started_at": 1.0, "clock_offset": 2.5}}
    s = summarize(str(tmp_path), plan(), results, {})
    # n2's clock is 2.5 s ahead of the controller's: its end on the controller's clock.
    assert [(h["state"], h["exit_code"], h["ended_at"], h["last_line"])
            for h in s["hosts"].values()] == [("succeeded", 0, 9.5, "rank 0 ok"),
                                              ("succeeded", 0, 9.0, "rank 1 ok"),
                                              ("failed", 3, 6.5, "rank 2 gave up")]


ABORT = ("terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
         "  what():  [enforce fail at gloo/transport/tcp/pair.cc:446] op.preamble.length <= "
         "op.nbytes. 8 vs 4\n")


def test_a_rank_that_crashed_is_named_with_its_crash_not_the_launchers_report(tmp_path):
    """A rank that died of SIGABRT (an exception no C++ thread caught) leaves no traceback and
    no error file: its own last words and the signal are the cause, not torchrun's (or
    accelerate's) ChildFailedError, the last traceback of the node log."""
    report = failed_report(other=2, other_local=0, other_code=-15, root=3, root_local=1,
                           root_code=-6)
    report = ("Traceback (most recent call last):\n  File \"run.py\", line 9, in <module>\n"
              + report.replace("  error_file: <N/A>\n=",
                               "  error_file: <N/A>\n  traceback : Signal 6 (SIGABRT) received "
                               "by PID 405\n="))
    node = two_rank_node(tmp_path, {0: ("Signal 15 received\n", 99.0),
                                    1: ("[default1]:" + ABORT, 98.0)}, report)
    found = failure_of(node)
    assert (found["failing_rank"], found["local_rank"]) == (3, 1)
    assert found["exception"].startswith("gloo::EnforceNotMet: [enforce fail at gloo/")
    assert found["exception"].endswith("; killed by SIGABRT")
    # Nothing on its stderr: still the signal, not the launcher's exception.
    node = two_rank_node(tmp_path / "quiet", {0: ("Signal 15 received\n", 99.0),
                                              1: ("loading batch\n", 98.0)}, report)
    assert failure_of(node)["exception"] == "killed by SIGABRT (6) without a traceback"
    # Without the rank's files (log_dir elsewhere): what torchrun's report says of it.
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "node.log").write_text(report)
    assert failure_of(str(tmp_path / "bare"))["exception"] == (
        "killed by SIGABRT (6) without a traceback")
    (tmp_path / "bare" / "node.log").write_text(report.replace("Failures:", "Failed:"))
    assert failure_of(str(tmp_path / "bare"))["exception"] == (
        "Signal 6 (SIGABRT) received by PID 405")


def test_a_crashed_rank_under_a_launcher_without_per_rank_files(tmp_path):
    """DeepSpeed's launcher exits with the rank's code modulo 256 (250 for SIGABRT); the node
    log has the rank's crash and the launcher's line naming the rank and its code."""
    log = ("[2026-11-25 15:23:57,207] [INFO] [launch.py:245:main] process 689 spawned\n"
           + ABORT + "[2026-11-25 15:24:06,226] [ERROR] [launch.py:259:sigkill_handler] "
           "['/usr/bin/python3.11', '-u', 'deepspeed_step.py', '--local_rank=0'] exits with "
           "return code = -6\nsrun: error: n1: task 0: Exited with exit code 250\n")
    (tmp_path / "node.log").write_text(log)
    found = failure_of(str(tmp_path))
    assert found["local_rank"] == 0
    assert found["exception"].startswith("gloo::EnforceNotMet: [enforce fail at gloo/")
    assert found["exception"].endswith("; killed by SIGABRT")
    # A peer's connection error in the log does not hide the crash that came first.
    (tmp_path / "node.log").write_text(log.replace(
        "[2026", tb(3, "RuntimeError: Connection closed by peer [10.0.0.2]:5") + "[2026", 1))
    assert failure_of(str(tmp_path))["exception"].startswith("gloo::EnforceNotMet")
    # A rank's own exception stays the cause.
    (tmp_path / "node.log").write_text(DEEPSPEED_NODE_LOG)
    assert failure_of(str(tmp_path))["exception"] == "RuntimeError: injected failure on rank 3"
    # The summary's reason, no longer "exit code 250".
    results = {"n0": {"job_state": "stopped", "exit_code": 1, "ended_at": 12.0},
               "n1": {"job_state": "failed", "exit_code": 250, "ended_at": 11.0},
               "n2": {"job_state": "stopped", "exit_code": 1, "ended_at": 12.0}}
    (tmp_path / "nodes" / "n1").mkdir(parents=True)
    (tmp_path / "nodes" / "n1" / "node.log").write_text(log)
    reason = summarize(str(tmp_path), plan(), results, {})["reason"]
    assert reason.startswith("node n1 (node_rank 1): gloo::EnforceNotMet: "), reason
    assert "killed by SIGABRT" in reason, reason


def test_a_rank_aborted_at_exit_says_so(tmp_path):
    """torch 2.13 with gloo may abort a rank as it exits without destroy_process_group() while
    a peer is still up: "terminate called without an active exception", SIGABRT, after the
    rank's own work succeeded. The summary names that, not "exit code 250"."""
    (tmp_path / "node.log").write_text(
        "torchherd-deepspeed ok host=n1 node_rank=1 local_rank=0 rank=1 world_size=2\n"
        "terminate called without an active exception\n"
        "[2026-11-25 15:24:06,226] [ERROR] [launch.py:259:sigkill_handler] ['/usr/bin/python3',"
        " '-u', 'deepspeed_step.py', '--local_rank=0'] exits with return code = -6\n")
    assert failure_of(str(tmp_path))["exception"] == (
        "terminate called without an active exception; killed by SIGABRT")
    # With PYTHONFAULTHANDLER=1 the interpreter reports the signal after it: the why stays.
    log = (tmp_path / "node.log").read_text().replace(
        "exception\n", "exception\nFatal Python error: Aborted\n\nThread 0x7f (most recent "
        "call first):\n  <no Python frame>\n")
    (tmp_path / "node.log").write_text(log)
    assert failure_of(str(tmp_path))["exception"] == (
        "terminate called without an active exception; killed by SIGABRT")


def detached(standby=True):
    p = plan("c10d", "3:3")
    p["nodes"].append({"host": "n3", "address": "10.0.0.3", "node_rank": 3, "standby": standby})
    p["job"].update(detach=True, restarts=1)
    return p


def test_a_standby_not_needed_is_neither_a_failure_nor_a_part_of_the_result(tmp_path):
    results = {f"n{i}": {"job_state": "succeeded", "exit_code": 0} for i in range(3)}
    results["n3"] = {"job_state": "standby", "exit_code": 0}
    s = summarize(str(tmp_path), detached(), results, {})
    assert s["state"] == "succeeded" and "n3 waited as standby, not needed" in s["reason"]
    assert s["hosts"]["n3"]["standby"] and not s["hosts"]["n0"]["standby"]
    assert s["incidents"] == []
    # Whichever node waited: torchrun's rendezvous takes the first nodes to join.
    results["n1"], results["n3"] = results["n3"], results["n1"]
    assert summarize(str(tmp_path), detached(), results, {})["state"] == "succeeded"


def test_a_node_lost_and_the_standby_that_took_its_place_are_the_incident(tmp_path):
    # Rank 0's node said something in each attempt; the others' ranks are silent.
    results = {"n0": {"job_state": "succeeded", "exit_code": 0, "first_output_at": 10.0,
                      "attempts": {"0": {"started_at": 9.0, "output_at": 10.0},
                                   "1": {"started_at": 70.0, "output_at": 71.5}}},
               # Its silent ranks' first words were their errors at the loss.
               "n1": {"job_state": "succeeded", "exit_code": 0,
                      "attempts": {"0": {"started_at": 9.0, "output_at": 50.3},
                                   "1": {"started_at": 70.0, "output_at": None}}},
               "n2": {"unreachable": True, "lost_at": 50.0, "error": "ssh: no route"},
               "n3": {"job_state": "succeeded", "exit_code": 0, "standby_used": True}}
    s = summarize(str(tmp_path), detached(), results, {})
    assert s["state"] == "succeeded" and "n3 took the place as standby" in s["reason"]
    assert s["incidents"] == [{
        "restart": 1, "by": "torchrun", "at": 50.0, "kind": "node_lost", "node": "n2",
        "node_rank": 2, "why": "ssh: no route", "replaced_by": "n3",
        "first_output_after": 21.5}]
    # While it runs, the standby's own attempt's output says it took part.
    results["n3"] = {"job_state": "running",
                     "attempts": {"0": {"started_at": 70.0, "output_at": None}}}
    results["n0"]["job_state"] = "running"
    assert summarize(str(tmp_path), detached(), results, {})["incidents"][0]["replaced_by"] == "n3"


def test_a_job_whose_rendezvous_never_formed_is_a_failure_though_no_node_failed(tmp_path):
    results = {f"n{i}": {"job_state": "standby", "exit_code": 0} for i in range(4)}
    s = summarize(str(tmp_path), detached(), results, {})
    assert s["state"] == "failed" and "rendezvous never formed" in s["reason"]


def test_the_timings_say_when_the_launchers_started_ahead_were_started_and_ready():
    p = dict(plan(), started_at=101.0, launched_at=100.0)
    warm = {"n0": {"used": True, "pid": 7, "waited": 0.0, "started_at": 102.5, "ready_at": 105.0,
                   "asked_at": 106.0},
            "n1": {"used": True, "pid": 8, "waited": 0.4, "started_at": 102.7, "ready_at": 106.4,
                   "asked_at": 106.0},
            # Started anew here (its launcher started ahead was gone): not counted.
            "n2": {"used": False, "why": "none waits for this run"}}
    results = {h: {"job_state": "succeeded", "exit_code": 0, "first_output_at": 109.0,
                   "ended_at": 110.0, "warm": w} for h, w in warm.items()}
    timings = summarize("/nonexistent", p, results, {})["timings"]
    assert timings["launcher_started"] == 2.7 and timings["launcher_ready"] == 6.4
    assert timings["first_output"] == 9.0
    # None started ahead: no such timing.
    for r in results.values():
        r["warm"] = None
    assert "launcher_ready" not in summarize("/nonexistent", p, results, {})["timings"]


def test_a_node_outside_the_limit_keeps_its_last_entry_not_unknown(tmp_path):
    """status, stop or collect with --limit: the run's nodes outside it were not asked (no
    answer, no checked_at), which says nothing new of them."""
    done = {f"n{i}": {"job_state": "succeeded", "exit_code": 0} for i in range(3)}
    first = summarize(str(tmp_path), plan(), done, {})
    assert first["state"] == "succeeded"
    asked = {"n0": done["n0"]}
    again = summarize(str(tmp_path), plan(), asked, {}, previous=first["hosts"],
                      not_asked=["n1", "n2"])
    assert again["state"] == "succeeded" and again["hosts"]["n1"] == first["hosts"]["n1"]
    # Without the limit's word, a node that gave no answer is unknown, as before.
    assert summarize(str(tmp_path), plan(), asked, {}, previous=first["hosts"])["hosts"][
        "n1"]["state"] == "unknown"
    # Never summarized before: unknown all the same.
    assert summarize(str(tmp_path), plan(), asked, {}, not_asked=["n1", "n2"])["hosts"][
        "n1"]["state"] == "unknown"


def test_the_nodes_use_is_summed_up_and_the_node_whose_gpus_sat_idle_is_named(tmp_path):
    """n0 and n1 worked; n2's GPU sat idle for 25 s in the middle while theirs worked. The
    summary takes every sample from the records collect brought back, or an answer's recent
    samples where none came back (n1)."""
    from ansible_collections.torchherd.cluster.plugins.module_utils._use import add, brief
    from ansible_collections.torchherd.cluster.plugins.plugin_utils._summary import table

    def use_of(utils):
        use = {"every": 5.0, "gpus": [0], "memory_total_mib": 4096}
        for i, util in enumerate(utils):
            use = add(use, [100.0 + 5 * i, 1, 40.0, 1024.0, [[util, 2048.0 + i]]])
        return use

    busy = use_of([95.0] * 12)
    idle = use_of([0.0 if 4 <= i <= 8 else 95.0 for i in range(12)])
    for host, use in (("n0", busy), ("n2", idle)):
        (tmp_path / "nodes" / host).mkdir(parents=True)
        (tmp_path / "nodes" / host / RECORD).write_text(json.dumps({"use": use}))
    results = {h: {"job_state": "succeeded", "exit_code": 0, "use": brief(u)}
               for h, u in (("n0", busy), ("n1", busy), ("n2", idle))}
    s = summarize(str(tmp_path), plan(), results, {})
    assert s["idle_gpus"] == {"n2": 25.0}
    gpu = s["hosts"]["n2"]["use"]["stats"]["gpus"][0]
    assert gpu["peak_memory_mib"] == 2059.0 and round(gpu["mean_util"]) == 55
    text = table(s)
    assert "gpu 95% 2.0G" in text and "gpu 55% 2.0G" in text
    assert "idle GPUs on n2: 25 s while the other nodes' GPUs worked" in text
    # Nothing sampled (sample_interval 0): no column value, nobody named.
    plain = summarize(str(tmp_path / "none"), plan(), {
        h: {"job_state": "succeeded", "exit_code": 0} for h in ("n0", "n1", "n2")}, {})
    assert plain["idle_gpus"] == {} and plain["hosts"]["n0"]["use"] is None


def test_a_later_status_keeps_the_drivers_incidents(tmp_path):
    """The driver adds its restarts' incidents to summary.json after its last launch (recorded
    from a real restart on the local nodes: exception on rank 3, restart_on exception); status,
    stop or collect write the summary again from the nodes, which know nothing of them."""
    from ansible_collections.torchherd.cluster.plugins.plugin_utils._summary import write_summary

    incident = {"at": 1795874641.8471513, "first_output_after": 10.723, "kind": "exception",
                "node": None, "node_rank": 1, "replaced_by": None, "restart": 1,
                "why": "node node1 (node_rank 1) rank 3: RuntimeError: injected failure on "
                       "rank 3"}
    done = {f"n{i}": {"job_state": "succeeded", "exit_code": 0} for i in range(3)}
    first, _table, path = write_summary(str(tmp_path), plan(), done, {})
    with open(path, encoding="utf-8") as handle:
        summary = json.load(handle)
    summary["incidents"] = [incident]
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(summary, handle)
    again, _table, _path = write_summary(str(tmp_path), plan(), done, {})
    assert again["incidents"] == [incident]
    with open(path, encoding="utf-8") as handle:
        assert json.load(handle)["incidents"] == [incident]
    assert "incidents" not in first  # a run without restarts has none


def test_the_summarys_plan_shows_what_preflight_resolved_and_no_secret(tmp_path):
    planned = {"run_id": "r1", "nproc_per_node": "auto", "world_size": None,
            "master": {"host": "n0", "addr": "10.0.0.1", "port": "auto"},
            "job": {"secret_env": {"TOKEN": "s3cret"}}}
    # Stopped before its verdict: the plan's own values, its secrets hidden.
    before = resolved_plan(str(tmp_path), planned)
    assert before["nproc_per_node"] == "auto" and before["master"] == planned["master"]
    assert before["nprocs"] == {} and before["interfaces"] == {}
    assert before["interconnect"] is None and before["preflight_warnings"] == []
    assert before["job"]["secret_env"] == {"TOKEN": "********"}
    gate = {"nproc_per_node": 2, "world_size": 4, "nprocs": {"n0": 2, "n1": 2},
            "master_port": 29611, "interfaces": {"n0": "eth1"}, "interconnect": {"ok": True},
            "warnings": [{"host": "n1", "check": "shm"}]}
    (tmp_path / "preflight.json").write_text(json.dumps({"gate": gate}))
    after = resolved_plan(str(tmp_path), planned)
    assert after["nproc_per_node"] == 2 and after["world_size"] == 4
    assert after["master"] == {"host": "n0", "addr": "10.0.0.1", "port": 29611}
    assert after["nprocs"] == gate["nprocs"] and after["interfaces"] == gate["interfaces"]
    assert after["interconnect"] == {"ok": True}
    assert after["preflight_warnings"] == gate["warnings"]
    assert "s3cret" not in json.dumps(after) and planned["master"]["port"] == "auto"


def test_a_start_that_came_with_the_facts_call_ends_with_the_sync_not_before_it():
    """A relaunch's starts answered in preflight's facts calls (start.with_facts), before its
    verdict: the start phase then takes no time of its own, never a negative one."""
    marks = {"plan": 1.0, "preflight": 3.0}
    results = {h: {"sync": {"files": 0, "bytes": 0}, "sync_ended_at": None,
                   "start_answered_at": at} for h, at in (("n0", 2.6), ("n1", 2.8))}
    ends = phase_ends(marks, results)
    assert ends["sync"] == ends["start"] == 3.0
    timings = phase_timings(0.5, ends)
    assert timings["start"] == 0 and min(timings.values()) >= 0, timings
    # The full path: the start's answers after the sync.
    results["n1"]["start_answered_at"] = 4.5
    assert phase_ends(marks, results)["start"] == 4.5
