"""The job's use of the node: nvidia-smi's answer read, the samples bounded for a job of any
length, the stats the summary shows and the idle node named."""

from __future__ import annotations

import json
import os
import stat
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._use import (
    POINTS,
    Sampler,
    add,
    brief,
    busy_percent,
    cpu_times,
    idle_spells,
    memory,
    parse_gpu_use,
    stats,
)

# nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total
# --format=csv,noheader,nounits, as an 8-GPU node answers (one GPU that cannot tell).
SMI = """0, 97, 40213, 81559
1, 95, 40101, 81559
2, [N/A], [N/A], 81559
"""


def test_nvidia_smis_answer_is_read_and_what_it_cannot_tell_is_none():
    assert parse_gpu_use(SMI) == [(0, 97.0, 40213.0, 81559.0), (1, 95.0, 40101.0, 81559.0),
                                  (2, None, None, 81559.0)]
    assert parse_gpu_use("No devices were found\n") == []


def test_cpu_and_memory_from_proc(tmp_path):
    (tmp_path / "stat").write_text("cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (tmp_path / "meminfo").write_text("MemTotal:       16777216 kB\nMemFree: 1 kB\n"
                                      "MemAvailable:    8388608 kB\n")
    assert cpu_times(str(tmp_path)) == (200, 1000)
    assert memory(str(tmp_path)) == (8192.0, 16384.0)
    assert busy_percent((200, 1000), (260, 1100)) == 60.0
    assert busy_percent(None, (1, 2)) is None


def point(t, cpu, util, mem=1000.0):
    return [t, 1, cpu, 500.0, [[util, mem]]]


def test_a_week_of_samples_stays_bounded_and_keeps_its_whole_course():
    use = {"every": 5.0, "step": 5.0, "points": [], "gpus": [0]}
    week = 7 * 24 * 3600 // 5
    for i in range(week):
        use = add(use, point(i * 5.0, 50.0, 100.0 if i < week // 2 else 0.0, float(i)))
    assert len(use["points"]) <= POINTS
    assert len(json.dumps(use)) < 40_000
    assert use["points"][0][0] == 0.0  # the start is still there
    assert sum(p[1] for p in use["points"]) == week  # every sample counted once
    s = stats(use)
    assert s["gpus"][0]["peak_memory_mib"] == week - 1
    assert abs(s["gpus"][0]["mean_util"] - 50.0) < 0.5  # half the week busy, weighed right
    # One grain for the whole week: every point but the last (filling up) as long as the first.
    assert {p[1] for p in use["points"][:-1]} == {use["per"]}
    assert use["step"] == 5.0 * use["per"] and use["per"] >= week / POINTS
    assert use["recent"][-1] == point((week - 1) * 5.0, 50.0, 0.0, float(week - 1))
    assert len(use["recent"]) == 3


def test_brief_carries_the_last_point_and_the_stats_not_the_points():
    use = {"every": 5.0, "gpus": [0]}
    for p in (point(1, 10, 90), point(2, 30, 70)):
        use = add(use, p)
    b = brief(use)
    assert "points" not in b and b["recent"] == [point(1, 10, 90), point(2, 30, 70)]
    # The cells the tables show: the stats (the summary's) and the last sample (the live view's).
    assert b["cell"] == "gpu 80% 1.0G" and b["now"] == "gpu 70% 1.0G"
    cpu_only = add({"every": 5.0}, [1, 1, 42.4, 3072.0, []])
    assert brief(cpu_only)["now"] == "cpu 42% 3.0G" and brief(cpu_only)["cell"] == "cpu 42% 3.0G"
    assert b["stats"]["gpus"][0]["mean_util"] == 80.0 and b["stats"]["mean_cpu"] == 20.0
    assert brief({}) == {}


def test_the_node_whose_gpus_sit_idle_while_the_others_work_is_named():
    busy = [point(t, 90, 95) for t in range(0, 60, 5)]
    # b's GPUs idle from 20 s to 40 s (five samples), working before and after.
    b = [point(t, 5, 0 if 20 <= t <= 40 else 95) for t in range(0, 60, 5)]
    assert idle_spells({"a": busy, "b": b, "c": busy}) == {"b": 25.0}
    # Not idle now: the live view says nothing of it.
    assert idle_spells({"a": busy, "b": b}, now=True) == {}
    # Idle to its last sample: said now, for as long as it lasts.
    late = [point(t, 5, 0 if t >= 45 else 95) for t in range(0, 60, 5)]
    assert idle_spells({"a": busy, "b": late}, now=True) == {"b": 15.0}
    # All idle (the job loads its data, or ended): nobody is singled out.
    idle = [point(t, 5, 0) for t in range(0, 60, 5)]
    assert idle_spells({"a": idle, "b": idle}) == {}
    # Two idle samples are a pause, not a straggler.
    pause = [point(t, 5, 0 if t in (20, 25) else 95) for t in range(0, 60, 5)]
    assert idle_spells({"a": busy, "b": pause}) == {}
    # A node without GPUs is never idle nor working.
    cpu_only = [[t, 1, 50.0, 1.0, []] for t in range(0, 60, 5)]
    assert idle_spells({"a": busy, "b": cpu_only}) == {}
    assert idle_spells({"a": cpu_only, "b": idle}) == {}
    # The others' samples taken at other moments (other clocks, other starts) still count.
    shifted = [point(t + 2.5, 90, 95) for t in range(0, 60, 5)]
    assert idle_spells({"a": shifted, "b": late}, now=True) == {"b": 15.0}


def test_the_sampler_writes_points_with_every_gpu_the_node_has(tmp_path):
    (tmp_path / "stat").write_text("cpu  100 0 100 700 100 0 0 0 0 0\n")
    (tmp_path / "meminfo").write_text("MemTotal: 2048 kB\nMemAvailable: 1024 kB\n")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0, 97, 40213, 81559\\n1, 3, 100, 81559\\n'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    written = []
    sampler = Sampler(0.05, written.append, proc=str(tmp_path), smi=str(smi)).start()
    deadline = time.monotonic() + 10
    while len(written) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    use = written[-1]
    assert use["gpus"] == [0, 1] and use["gpu_memory_total_mib"] == [81559.0, 81559.0]
    assert use["memory_total_mib"] == 2
    assert use["points"][-1][3] == 1 and use["points"][-1][4] == [[97.0, 40213.0], [3.0, 100.0]]


def test_a_node_without_nvidia_smi_samples_cpu_and_memory(tmp_path):
    written = []
    sampler = Sampler(0.05, written.append, smi="").start()
    deadline = time.monotonic() + 10
    while len(written) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    last = written[-1]["points"][-1]
    assert "gpus" not in written[-1] and last[4] == []
    assert last[3] is not None and last[3] > 0 and os.path.exists("/proc/stat")


def test_the_first_sample_comes_a_second_after_the_start_whatever_the_interval():
    """So that a job of a few seconds has one, and the tables show the same columns each run."""
    written = []
    began = time.monotonic()
    sampler = Sampler(60.0, written.append, smi="").start()
    deadline = time.monotonic() + 10
    while not written and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    assert written and time.monotonic() - began < 5.0
    assert written[0]["points"][0][2] is not None  # the CPU's share over that first second
