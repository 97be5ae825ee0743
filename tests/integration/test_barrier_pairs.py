"""The start barrier proves every pair of nodes on the job's interfaces, not only each node and
the master: two workers that cannot connect stop the launch before any launcher starts, named,
instead of a hang at init until the job's timeout. Real SSH, real nftables, real traffic."""

from __future__ import annotations

import json
import time

import pytest

from driver import Exit, launch
from tests.integration.helpers import EXAMPLES, JOB_PROCS

pytestmark = pytest.mark.cluster

TABLE = "thpairs"
RUN_DIR = "/root/.torchherd/runs/pairs-blocked"


@pytest.mark.parametrize("forks", [None, 2], ids=["barrier-in-start", "barrier-in-supervisors"])
def test_two_workers_that_cannot_connect_stop_the_launch_naming_both(uneven, tmp_path, forks,
                                                                     monkeypatch):
    if forks:  # fewer forks than nodes: the barrier runs in the supervisors (the schedule)
        monkeypatch.setenv("ANSIBLE_FORKS", str(forks))
    master, a, b = uneven.nodes
    # Inside a, on its way out to b's job (data) address: new TCP connections are dropped, as a
    # route or an ACL between two workers would. The job's own firewall rules (on, as by
    # default) open the nodes' input chains and cannot open this. The barrier's paths to and
    # from the master all pass, and so does b's own way to a; gloo's from a to b would hang.
    uneven.exec(a, ["nft", "add", "table", "inet", TABLE])
    uneven.exec(a, ["nft", "add", "chain", "inet", TABLE, "output",
                    "{ type filter hook output priority 0; policy accept; }"])
    uneven.exec(a, ["nft", "add", "rule", "inet", TABLE, "output", "ip", "daddr", b.data_ip,
                    "ct", "state", "new", "drop"])
    try:
        began = time.monotonic()
        # A job timeout far beyond the test's bound: only the barrier can end it that soon.
        result = launch({"script": "allreduce.py", "code_src": str(EXAMPLES),
                         "nproc_per_node": 1, "run_id": "pairs-blocked", "timeout": 900},
                        uneven.inventory, runs_dir=tmp_path)
        took = time.monotonic() - began
    finally:
        uneven.exec(a, ["nft", "delete", "table", "inet", TABLE], check=False)

    assert not result.ok
    reason = result.reason
    assert f"{a.name} -> {b.name}: peers reachable" in reason, reason
    assert f"from {a.name} ({a.data_ip}) to {b.name} at {b.data_ip}:" in reason, reason
    assert "found timed out after 3 s" in reason, reason
    # The fix: in the gate's problem where the start's barrier found it, else in the reason.
    fixes = " ".join(p.get("fix", "") for p in result.problems) if not forks else reason
    assert "allow TCP from" in fixes, (fixes, reason)
    # Only that pair: the master's paths and b's own way to a are open.
    assert f"{b.name} -> {a.name}" not in reason and f"{master.name} -> " not in reason
    assert took < 60, f"the launch took {took:.0f} s"
    if not forks:
        # Found by the start's barrier, judged by the gate: a preflight failure, in its table.
        assert result.exit_code == Exit.PREFLIGHT_FAILED, (result.exit_code, reason)
        assert f"{a.name} -> {b.name}" in {p["host"] for p in result.problems}, result.problems
    # No launcher started anywhere, and no process or rule of the run is left.
    for node in uneven.nodes:
        assert uneven.pids(node, JOB_PROCS) == [], node.name
        rules = uneven.exec(node, ["nft", "list", "ruleset"]).stdout
        assert "pairs-blocked" not in rules, f"a rule of the run is left on {node.name}"
        if not forks:  # called off in the start task: the node has no run of it
            started = uneven.exec(node, ["test", "-e", f"{RUN_DIR}/pid"], check=False)
            assert started.returncode != 0, f"the job started on {node.name}"
            continue
        # Called off in the supervisor: the job ended there as failed, before its launcher.
        record = json.loads(uneven.read_file(node, f"{RUN_DIR}/run.json"))
        assert record["barrier"]["where"] == "supervisors" and not record["barrier"]["go"]
        assert f"{a.name} -> {b.name}" in record["barrier"]["error"], record["barrier"]
        log = uneven.read_file(node, f"{RUN_DIR}/node.log")
        assert f"the start was called off on every node: {a.name} -> {b.name}" in log, log
        assert "torchherd-allreduce" not in log and "torch.distributed" not in log, log
