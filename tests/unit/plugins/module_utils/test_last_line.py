"""A node's last line (the final table's, status's) is the job's, not the launcher's banner."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import last_line

BANNER = ("*****************************************\n"
          "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, "
          "to avoid your system being overloaded, please further tune the variable for optimal "
          "performance in your application as needed. \n"
          "*****************************************\n")


def test_the_banner_after_the_jobs_last_words_is_passed_over(tmp_path):
    log = tmp_path / "node.log"
    log.write_text("[default0]:epoch 3 loss 0.12\n" + BANNER + "\n")
    assert last_line(log) == "[default0]:epoch 3 loss 0.12"
    # With torch's logging prefix, as a warning of torch.distributed.run prints it.
    log.write_text("[default0]:done\n" + "".join(
        f"W1128 10:00:00.123000 4242 torch/distributed/run.py:793] {line}\n"
        for line in BANNER.splitlines()))
    assert last_line(log) == "[default0]:done"


def test_a_log_of_the_banner_alone_has_no_last_line_and_others_keep_theirs(tmp_path):
    log = tmp_path / "node.log"
    log.write_text(BANNER)
    assert last_line(log) == ""
    log.write_text("loss *** 0.5\n")  # stars in a line of the job's are the job's
    assert last_line(log) == "loss *** 0.5"
    assert last_line(tmp_path / "missing.log") == ""


def test_the_live_line_is_the_last_a_rank_printed_not_torchs_or_the_supervisors(tmp_path):
    """A node's line for the live view (job_line): torchrun's and accelerate's rank lines
    first, past Python's warnings, torch's glog and logging lines, the banner and the
    supervisor's own; a DeepSpeed job's ranks print without a prefix, its launcher's logging
    is passed over."""
    from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import job_line

    log = tmp_path / "node.log"
    log.write_text("torchherd: started\n[default0]:step 7 loss 0.3\n"
                   "[default1]:/t.py:3: UserWarning: careful\n"
                   "[default1]:  warnings.warn(\n" + BANNER +
                   "[W1128 10:00:00.1 socket.cpp:1] slow\n"
                   "INFO:torch.distributed.elastic.agent.server.api:[default] done\n"
                   "agent line of the launcher\ntorchherd: stopping: n1 ended\n")
    assert job_line(log) == "[default0]:step 7 loss 0.3"
    log.write_text("[2026-11-28 10:00:00,123] [INFO] [launch.py:146:main] WORLD INFO DICT\n"
                   "step 3 of a deepspeed rank\n"
                   "[2026-11-28 10:00:01,000] [INFO] [launch.py:351:main] Process 42 exits\n")
    assert job_line(log) == "step 3 of a deepspeed rank"
    log.write_text(BANNER + "torchherd: the start was called off\n")
    assert job_line(log) == ""
    assert job_line(tmp_path / "missing.log") == ""
    # Only the tail is read, and its first, cut line is not taken for a line.
    log.write_text("[default0]:old\n" + "x" * 5000 + "\n" + "W1128 10:00:00.1 1 a.py:1] w\n")
    assert job_line(log) == ""
