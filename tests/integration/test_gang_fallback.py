"""The watch's fallback for an incomplete gang, on a real cluster: a node that got through the
start's barrier but whose link to the master's gang is refused (the master port still open) is
watched on its own, with every other node, and its failure still stops the job everywhere.

Without the fallback the watch would wait on the master alone, whose gang cannot speak for the
node that never joined it: that node's failure would go unseen until the master's own job ended
(here: 300 s later)."""

from __future__ import annotations

import json
import textwrap
import threading

import pytest

from driver import launch
from driver.api import Exit
from tests.integration.helpers import assert_no_job_left

pytestmark = pytest.mark.cluster

MASTER_PORT = 29500
# The node rank that leaves the job, and after how many seconds (before the master's gang gives
# up waiting for it: the fallback must also catch a failure that came first).
CUT_RANK, FAILS_AFTER = 2, 5
# No collective: nothing but torchrun's own store (on the master port) crosses between nodes,
# so the broken link touches the gang alone.
SCRIPT = textwrap.dedent("""\
    import os, sys, time
    node = int(os.environ["GROUP_RANK"])
    print(f"torchherd-gangcut node={node} up", flush=True)
    if node == int(sys.argv[1]):
        time.sleep(float(sys.argv[2]))
        sys.exit(3)
    time.sleep(300)
""")
# watch_every_node.yml's one task, on the master: the only node the watch waited on.
EVERY_NODE_TASK = "Put every node into the group watched node by node"
JOB_PROCS = r"torch\.distributed\.run|gangcut\.py"


def cut_from_the_gang(cluster, node_index):
    """On the node: let its first new connection to a port the master's kernel picked pass, and
    refuse every later one; SSH and the master port (the barrier, torchrun's store) stay open.

    The first is the barrier's pair check to the master's back port (a refused one calls the
    start off); the next is the node's link to the master's gang, which the barrier's go names
    only after the pairs: the gang's port cannot be known ahead, but its turn can, so the cut
    needs no timing. In the node's output chain: the job's firewall opens the nodes' input
    chains (the host's own, where one exists), so a rule there could be passed over by the
    job's own."""
    master = cluster.nodes[0].ip
    to_kernel_ports = ["ip", "daddr", master, "tcp", "dport", "!=", f"{{ 22, {MASTER_PORT} }}",
                       "ct", "state", "new"]
    for command in (
        ["add", "table", "inet", "gangcut"],
        ["add", "set", "inet", "gangcut", "passed", "{ type ipv4_addr ; flags dynamic ; }"],
        ["add", "chain", "inet", "gangcut", "output",
         "{ type filter hook output priority 0 ; policy accept ; }"],
        ["add", "rule", "inet", "gangcut", "output", *to_kernel_ports, "ip", "daddr", "@passed",
         "reject", "with", "tcp", "reset"],
        ["add", "rule", "inet", "gangcut", "output", *to_kernel_ports, "add", "@passed",
         "{ ip daddr }"],
    ):
        cluster.exec(node_index, ["nft", *command])


def test_a_node_cut_from_the_gang_is_watched_on_its_own(make_cluster, tmp_path):
    cluster = make_cluster("gangcut", 3)
    code = tmp_path / "code"
    code.mkdir()
    (code / "gangcut.py").write_text(SCRIPT)
    cut_from_the_gang(cluster, CUT_RANK)
    outcome, tasks = {}, []

    def on_event(event):
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok":
            tasks.append((data.get("task"), data.get("task_action"), data.get("host")))

    job = {"script": "gangcut.py", "args": [str(CUT_RANK), str(FAILS_AFTER)],
           "code_src": str(code), "nproc_per_node": 1, "master_port": MASTER_PORT,
           "run_id": "gangcut"}
    runner = threading.Thread(target=lambda: outcome.update(result=launch(
        job, cluster.inventory, runs_dir=tmp_path / "runs", on_event=on_event)))
    runner.start()
    runner.join(240)
    assert not runner.is_alive(), "launch did not return: the cut node's failure went unseen"
    result = outcome["result"]
    cut = cluster.nodes[CUT_RANK].name
    assert result.exit_code == Exit.JOB_FAILED, result.reason
    assert cut in result.reason

    # The master's gang saw one of the two other nodes join, so the watch put every node into
    # the group watched node by node.
    run_dir = tmp_path / "runs" / "gangcut"
    master_record = json.loads((run_dir / "nodes" / cluster.nodes[0].name / "run.json")
                               .read_text())
    assert master_record["gang"]["joined"] == 1 and master_record["gang"]["expected"] == 2
    assert (EVERY_NODE_TASK, "ansible.builtin.add_host", cluster.nodes[0].name) in tasks, tasks

    # The cut hit the gang's link, after the barrier let the node through.
    cut_log = (run_dir / "nodes" / cut / "node.log").read_text()
    assert "no link to the master's gang" in cut_log, cut_log

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["hosts"][cut]["state"] == "failed", summary["hosts"][cut]
    for node in cluster.nodes[:CUT_RANK]:
        assert summary["hosts"][node.name]["state"] == "stopped", summary["hosts"][node.name]
        assert (run_dir / "nodes" / node.name / "node.log").exists()
    assert_no_job_left(cluster, JOB_PROCS)
