# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The torchrun_job module's state=started: the start's firewall rules, the barrier and the
launch of the job under its supervisor on this node."""

from __future__ import annotations

import os
import socket

from ansible_collections.torchherd.cluster.plugins.module_utils._firewall import (
    FirewallError,
    Runner,
    converge_rules,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._probe import barrier, bind
from ansible_collections.torchherd.cluster.plugins.module_utils._rundir import last_line, read_state
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (
    empty,
    read_record,
    rules_opened,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import write as record
from ansible_collections.torchherd.cluster.plugins.module_utils._starterror import StartError
from ansible_collections.torchherd.cluster.plugins.module_utils._supervisor import (
    barrier_seen,
    check_start,
    gang_formed,
    launcher_argv,
    spawn,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._warm import dismiss


def _rules(module, p, state):
    return converge_rules(Runner(module), dict(p["firewall"], state=state, run_id=p["run_id"]))


def start(module, p, paths, with_facts=None):
    """Open the start's rules, meet at the barrier (in this call or, in the background, in the
    supervisor) and start the job; the result's fields.

    ``with_facts``: a relaunch's start in its facts call (node_facts), a dict whose ``refuse``
    says why this node must not start (None where it may, see _relaunch). The node then meets
    at the barrier in any case, so that the others learn at once, and refuses there where it
    must, or where the start could not get that far (the full path's start then meets the same
    error and reports it as always). A start called off there leaves nothing: the rules it
    opened go again, and the launcher started ahead stays for the full path's start."""
    refuse = with_facts.get("refuse") if with_facts is not None else None
    try:
        check_start(p, paths)
        argv = launcher_argv(p, paths)
        # The job's firewall rules before the barrier: a node reaches it only once its own
        # rules are in place, so no node starts before every node's firewall lets the others in.
        opened = {}
        if p["firewall"] is not None:
            opened["firewall"] = _rules(module, p, "present")
    except (StartError, FirewallError) as exc:
        if with_facts is None:
            raise
        argv, opened = [], {}
        refuse = refuse or f"the start failed: {exc}"
    changed = bool(opened and opened["firewall"]["changed"])
    if module.check_mode:
        return dict(changed=True, job_state="absent", pid=None, exit_code=None, cmd=argv,
                    run_dir=paths["dir"], log=paths["log"], last_line="", meta=p["meta"],
                    **opened)
    # What the record gets once the job starts: a start the barrier calls off leaves no run
    # directory on the node (nothing started), its answer says what it saw.
    seen = empty()
    if opened.get("firewall", {}).get("rules"):
        seen["firewall"] = rules_opened("start", opened["firewall"])
    probe = gang = None
    in_call = bool(p["barrier"]) and not p["barrier"]["background"]
    if refuse and not in_call:
        # No barrier to tell the others (the schedule starts with the facts only with one).
        return dict(changed=changed, started=False, job_state="absent", pid=None, exit_code=None,
                    cmd=argv, run_dir=paths["dir"], log=paths["log"], last_line="",
                    meta=p["meta"], probe={"refused_here": refuse}, record=seen, **opened)
    if in_call:
        b = p["barrier"]
        # The go names the master's gang port: the nodes stop each other after a failure
        # (see _gang), whatever the controller watches.
        gang_sock = bind(0)[0] if b["listen"] else None
        probe = barrier(p["master_addr"], p["master_port"], p["run_id"], b["timeout"],
                        b["window"], listen=b["listen"], expect=b["expect"],
                        source=b["source"] or None, gang=gang_sock,
                        name=str(p["meta"].get("host") or socket.gethostname()),
                        refuse=refuse)
        seen["barrier"] = dict(barrier_seen(probe),
                               where="start" if with_facts is None else "facts")
        gang = {"sock": gang_sock} if b["listen"] else {"port": probe.get("gang_port")}
        probe.pop("gang_port", None)
        if not probe.pop("go"):
            if gang_sock is not None:
                gang_sock.close()
            if with_facts is not None:
                if opened.get("firewall", {}).get("rules"):
                    try:
                        opened["firewall"] = _rules(module, p, "absent")
                    except FirewallError as exc:
                        opened["firewall"]["error"] = exc.msg
                    changed = True
                if refuse:
                    probe["refused_here"] = refuse
            elif p["warm"]:
                dismiss(paths["dir"])  # nothing starts: the launcher preflight started goes
            return dict(changed=changed, started=False, job_state="absent", pid=None,
                        exit_code=None, cmd=argv, run_dir=paths["dir"], log=paths["log"],
                        last_line="", meta=p["meta"], probe=probe, record=seen, **opened)
        if b["listen"] and gang_sock is None:
            gang = None  # no port for the gang here: the controller's watch stops the others
            gang_formed(paths, 0, b["expect"] - 1, "no port for the gang on the master")
    # The rules opened here go again as soon as the job ends on this node, by its supervisor,
    # also where no controller watches any more (detached, or gone).
    close = p["firewall"] if opened and opened["firewall"].get("rules") else None
    started_at = spawn(p, paths, argv, os.environ, gang=gang, close=close)
    state = read_state(paths)
    for section in ("firewall", "barrier"):
        if seen[section]:
            record(paths, section, **seen[section])
    extra = dict(opened, probe=probe) if probe is not None else opened
    return dict(changed=True, started=True, job_state=state["state"], pid=state["pid"],
                exit_code=state["exit_code"], cmd=argv, run_dir=paths["dir"],
                log=paths["log"], last_line=last_line(paths["log"]),
                started_at=started_at, meta=p["meta"], record=read_record(paths), **extra)
