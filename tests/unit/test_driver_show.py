"""torchherd show: the page of a run from its directory on the controller (driver/show.py),
on synthetic runs in the shapes real launches write (tests/unit/show_run.py)."""

from __future__ import annotations

import json
import re
import webbrowser
from pathlib import Path

import jsonschema
import markupsafe

from driver import cli, show, timeline
from tests.unit.show_run import HOSTILE, failed_run, restarted_run

SCHEMA = json.loads((Path(cli.__file__).parent / "schema.json").read_text())


def test_a_day_of_samples_on_64_nodes_makes_a_small_page(tmp_path):
    # A point every 5 minutes: more than a record keeps (the sampler's 240, each of them
    # several samples on a long job) and than a sparkline draws.
    run_dir = failed_run(tmp_path, nodes=64, hours=24, every=300, gpus=8)
    path, info = show.write(run_dir.name, runs_dir=tmp_path)
    text = path.read_text(encoding="utf-8")
    assert path == run_dir / show.PAGE and info.state == "failed"
    # What a browser lays out at once (tests/integration/test_driver.py times it there).
    assert len(text.encode()) < 400_000, len(text.encode())
    paths = re.findall(r'<svg class="spark [^"]*"[^>]*><path d="([^"]*)"', text)
    assert len(paths) == 64 * 4
    assert max(len(re.findall(r"-?\d+", d)) for d in paths) <= 2 * timeline.SERIES_POINTS
    for n in range(64):
        assert f">gpu{n:02d}<" in text or f">gpu{n:02d} " in text


def test_the_page_stands_alone_and_escapes_what_the_nodes_wrote(tmp_path):
    run_dir = failed_run(tmp_path, nodes=4, hours=0.1, every=5, gpus=2)
    text = show.render(run_dir)
    # Nothing fetched, nothing run: no script, no external file, font or style.
    assert "<script" not in text.lower()
    assert not re.search(r"""(src|href)=["']?(https?:|//)|@import|url\(""", text)
    # The failing rank's words, as text.
    assert HOSTILE not in text and str(markupsafe.escape(HOSTILE)) in text
    assert "The failure is laid to" in text and 'class="cause" open' in text
    # Its log's last lines, with the rank named as `logs` names it.
    assert "r11: RuntimeError: &lt;script&gt;" in text


def test_a_node_whose_gpus_sat_idle_while_the_others_worked_is_named(tmp_path):
    run_dir = failed_run(tmp_path, nodes=3, hours=0.1, every=5, gpus=1)
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    summary["idle_gpus"] = {"gpu02": 120.0}
    (run_dir / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    assert "GPUs idle 2 min 00 s while the others worked" in show.render(run_dir)


def test_a_run_without_samples_says_so(tmp_path):
    run_dir = failed_run(tmp_path, nodes=3, hours=0.1, every=5, gpus=1, samples=False)
    text = show.render(run_dir)
    assert "no samples" in text and '<svg class="spark' not in text


def test_a_running_job_no_collect_summed_up_yet(tmp_path):
    run_dir = failed_run(tmp_path, nodes=3, hours=0.1, every=5, gpus=1, summary=False)
    page = show.model(run_dir)
    assert page["state"] == "unknown" and "no summary.json" in page["reason"]
    lanes = page["svg"]["lanes"]
    assert [lane.host for lane in lanes] == ["gpu00", "gpu01", "gpu02"]
    # From the records (the node's clock put right by nothing known: as it is), bars to the
    # last time the record was written.
    assert all(lane.bars for lane in lanes)
    assert [p["name"] for p in page["svg"]["phases"]] == ["launch", "plan", "preflight"]


def test_a_restarted_run_draws_the_launch_before_faded_and_the_spare(tmp_path):
    run_dir = restarted_run(tmp_path)
    page = show.model(run_dir)
    lanes = {lane.host: lane for lane in page["svg"]["lanes"]}
    # The current launch's nodes by rank, then the lost node, which only the first ran on.
    assert list(lanes) == ["gpu00", "gpu03", "gpu02", "gpu01"]
    assert all(b["faded"] for b in lanes["gpu01"].bars)
    assert {m["cls"] for m in lanes["gpu01"].marks} >= {"lost", "incident"}
    assert [m["title"] for m in lanes["gpu03"].marks if m["cls"] == "spare"] == [
        "gpu03 takes node_rank 1 of gpu01 (restart 1)"]
    assert page["svg"]["restarts"][0]["label"] == "restart 1"
    rows = {row["host"]: row for row in page["rows"]}
    assert rows["gpu01"]["state"] == "lost" and "restart 1" in rows["gpu01"]["launch"]
    assert rows["gpu03"]["rank"] == "1" and rows["gpu03"]["state"] == "succeeded"
    text = show.render(run_dir)
    assert "Restarts" in text and ">gpu03<" in text


def test_downsample_keeps_the_peaks_of_memory_and_the_mean_of_utilization():
    times = [float(t) for t in range(1000)]
    values: list[float | None] = [10.0] * 1000
    values[500] = 90.0
    values[700] = None
    peaks = timeline.downsample(times, values, 0.0, 1000.0, buckets=100, peak=True)
    means = timeline.downsample(times, values, 0.0, 1000.0, buckets=100)
    assert len(peaks) == len(means) == 100
    assert max(v for _t, v in peaks if v is not None) == 90.0
    assert max(v for _t, v in means if v is not None) == 18.0


def test_cli_show_writes_where_asked_and_says_where(tmp_path, capsys):
    run_dir = failed_run(tmp_path, nodes=2, hours=0.1, every=5, gpus=1)
    out = tmp_path / "pages" / "run.html"
    assert cli.main(["show", run_dir.name, "--runs-dir", str(tmp_path), "-o", str(out),
                     "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["page"] == str(out) and doc["state"] == "failed" and out.is_file()
    assert cli.main(["show", run_dir.name, "--runs-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == f"{run_dir / show.PAGE}\n"
    assert cli.main(["show", "no-such-run", "--runs-dir", str(tmp_path), "--json"]) == 2
    jsonschema.validate(json.loads(capsys.readouterr().out), SCHEMA)


def test_cli_show_open_hands_the_file_to_the_browser(tmp_path, capsys, monkeypatch):
    run_dir = failed_run(tmp_path, nodes=2, hours=0.1, every=5, gpus=1)
    opened = []
    monkeypatch.setattr(webbrowser, "open", lambda uri: opened.append(uri) or False)
    assert cli.main(["show", run_dir.name, "--runs-dir", str(tmp_path), "--open"]) == 0
    assert opened == [(run_dir / show.PAGE).as_uri()]
    assert "no browser found" in capsys.readouterr().err


def test_the_axis_steps_are_round_in_the_unit_of_the_span():
    assert [t["label"] for t in timeline.Scale(0.0, 10.2).ticks()][:3] == ["0 s", "2 s", "4 s"]
    assert [t["label"] for t in timeline.Scale(0.0, 1000.0).ticks()] == [
        "0 min", "5 min", "10 min", "15 min"]
    assert [t["label"] for t in timeline.Scale(0.0, 86400.0).ticks()][-1] == "24 h"
    # The last label ends at the plot's edge, not beyond it.
    assert timeline.Scale(0.0, 86400.0).ticks()[-1]["anchor"] == "end"
