# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The start of the job on this node: its run directory's files, and the supervisor, detached
from the module's process (supervise)."""

from __future__ import annotations

import json
import os
import time

from ansible_collections.torchherd.cluster.plugins.module_utils._atomic import write_atomic
from ansible_collections.torchherd.cluster.plugins.module_utils._container import (
    container_name,
    runtime_env,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._launchers import LAUNCHERS
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import recorded_job
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.command import (
    container_env_names,
    job_env,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.meeting import (
    meeting_of,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor.supervise import (
    supervise,
)


def spawn(p, paths, argv, environ, gang=None, close=None):
    """Writes the run directory and starts torchrun under a detached supervisor; returns the
    start time once torchrun's pid is written (or 10 s have passed).

    `gang`: where the barrier ran in this call, the node's way into the gang, which the
    supervisor joins ({"sock": the master's listening socket} or {"port": the master's}).
    `close`: the firewall rule options of the rules this start opened, which the supervisor
    removes once the job has ended here (the run-state record says what it removed)."""
    os.makedirs(paths["torchrun_logs"], exist_ok=True)
    os.makedirs(paths["flight_recorder"], exist_ok=True)
    env, shown = job_env(p, paths["dir"], environ)
    secrets = None
    if p.get("container"):
        # The runtime passes the job's variables on by name; the secrets it never sees: they
        # go to the shim in the image through the launcher's standard input.
        for name in p["secret_env"]:
            env.pop(name, None)
        # Where the runtime takes them from copies of its own (apptainer), those copies.
        env.update(runtime_env(p["container"], env, container_env_names(p, paths, environ)))
        secrets = json.dumps({k: str(v) for k, v in p["secret_env"].items()}) + "\n" \
            if p["secret_env"] else None
    write_atomic(paths["cmd"], json.dumps(argv))
    write_atomic(paths["env"], json.dumps(shown, indent=1, sort_keys=True))
    started_at = time.time()
    # The run's own description; its times are the record's.
    meta = dict(p["meta"])
    if p["wrapper"]:
        meta["wrapper"] = p["wrapper"]  # stop needs to know (see _stop)
    if p.get("standby") is not None:
        meta["standby"] = {"delay": float(p["standby"].get("delay") or 0)}  # see standby
    if p.get("container"):
        # Stop removes the container too (see _stop), whatever ended its processes.
        meta["container"] = {
            "runtime": p["container"]["runtime"], "path": p["container"]["path"],
            "image": p["container"]["image"], "id": p["container"]["id"],
            "name": container_name(p["run_id"], p["node_rank"], p["restart"])}
    write_atomic(paths["meta"], json.dumps(meta))
    record(paths, "job", started_at=started_at, restart=p.get("restart"))

    background = bool((p.get("barrier") or {}).get("background"))
    meeting = meeting_of(p) if background or gang else None
    if gang and not background:
        meeting["met"] = gang
    first = os.fork()
    if first == 0:
        # Double fork: the supervisor is re-parented to init and outlives this SSH session.
        if os.fork() == 0:
            supervise(argv, env, p["chdir"], paths, p["timeout"], p["grace"], meeting,
                      dict(close, run_id=p["run_id"]) if close else None,
                      LAUNCHERS[p["launcher"]].rank_logs(p), secrets,
                      restarts=p["max_restarts"] > 0,
                      warm=bool(p.get("warm")) and not p["wrapper"] and not p.get("container"),
                      sample_every=float(p.get("sample_every") or 0))
        os._exit(0)
    os.waitpid(first, 0)
    if gang and gang.get("sock") is not None:
        gang["sock"].close()  # the supervisor's now
    # In the background the barrier may take its whole window, and a standby waits its delay:
    # the supervisor is the job then.
    later = background or float((p.get("standby") or {}).get("delay") or 0) > 0
    wanted = "supervisor" if later else "launcher"
    deadline = time.monotonic() + 10
    while wanted not in recorded_job(paths["dir"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return started_at
