# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What the torchrun_job module does on the node, one state of the module per file: start,
wait and stop, and report, the job's state on the node, which every state returns and
state=status is alone.

The module keeps its argument spec and ends a failure (StartError of _supervisor, FirewallError
of _firewall) with fail_json, once. Runs on the nodes (Python 3.8 and later).
"""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.report import report
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.start import start
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.stop import stop
from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.wait import wait
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import run_paths

STATES = {"started": start, "waiting": lambda module, p, paths: wait(module, p, paths,
                                                                     p["wait_timeout"]),
          "stopped": stop, "status": lambda module, p, paths: report(paths)}


def act(module, p):
    """Do what p["state"] asks of the run's job on this node: the module's result fields."""
    return STATES[p["state"]](module, p, run_paths(p["root"], p["run_id"]))
