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
