"""The final table shows each node's use where it was sampled, and names a node whose GPUs sat
idle while the others' worked."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from driver.api import Exit
from driver.result import RunResult
from driver.ui import _table


def rendered(result: RunResult) -> str:
    console = Console(width=200, record=True)
    console.print(_table(result))
    return console.export_text()


def host(rank: int, cell: str | None) -> dict:
    return {"node_rank": rank, "state": "succeeded", "exit_code": 0, "last_line": "done",
            "use": {"cell": cell, "now": cell, "stats": {}} if cell else None}


def test_the_use_column_shows_where_the_nodes_use_was_sampled():
    result = RunResult(run_id="r1", run_dir=Path("/tmp/r1"), action="launch",
                       state="succeeded", exit_code=Exit.OK, reason="ok",
                       hosts={"n0": host(0, "gpu 95% 39.3G"), "n1": host(1, "gpu 3% 1.0G")},
                       idle_gpus={"n1": 25.0})
    text = rendered(result)
    assert "use" in text.splitlines()[2] and "gpu 95% 39.3G" in text and "gpu 3% 1.0G" in text
    assert result.to_dict()["idle_gpus"] == {"n1": 25.0}
    # Nothing sampled (sample_interval 0): no column at all.
    plain = RunResult(run_id="r1", run_dir=Path("/tmp/r1"), action="launch",
                      state="succeeded", exit_code=Exit.OK, reason="ok",
                      hosts={"n0": host(0, None)})
    assert " use " not in rendered(plain).splitlines()[2]


def test_a_launch_in_waves_says_so(capsys):
    from driver.ui import Ui
    result = RunResult(run_id="r1", run_dir=Path("/tmp/r1"), action="launch",
                       state="succeeded", exit_code=Exit.OK, reason="ok",
                       hosts={"n0": host(0, None)}, waves=7,
                       waves_why="5 forks for 32 nodes: each task runs in 7 waves")
    assert result.to_dict()["waves"] == 7
    Ui().report(result, as_json=False)
    said = capsys.readouterr()
    assert "the launch ran in waves: 5 forks for 32 nodes" in said.out + said.err
