# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""What the torchrun_job module does on the node, one state of the module per file: start,
wait and stop, and report, the job's state on the node, which every state returns and
state=status is alone.

The module keeps its argument spec and ends a failure (StartError of _starterror, FirewallError
of _firewall) with fail_json, once. Runs on the nodes (Python 3.8 and later).

Each state imports its own file when it runs, and nothing else: a module's payload carries no
compiled code, so the node compiles every file the module imports, on every call. The
supervisor (_supervisor), the start's alone, is a third of the module's own code; a wait, a stop
or a status does not compile it (about 0.07 CPU-s a call). The start imports the supervisor
before it forks it, as it always did.
"""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import run_paths


def act(module, p):
    """Do what p["state"] asks of the run's job on this node: the module's result fields.
    (Each import stays spelled out: Ansible finds the files a module's payload carries by
    reading its imports.)"""
    paths = run_paths(p["root"], p["run_id"])
    state = p["state"]
    if state == "started":
        from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.start import start

        return start(module, p, paths)
    if state == "waiting":
        from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.wait import wait

        return wait(module, p, paths, p["wait_timeout"])
    if state == "stopped":
        from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.stop import stop

        return stop(module, p, paths)
    from ansible_collections.torchherd.cluster.plugins.module_utils._jobctl.report import report

    return report(paths)
