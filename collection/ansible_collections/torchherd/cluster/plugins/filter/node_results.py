# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Gather what the launch play registered on each node into one plain dict per host."""

from __future__ import annotations

from ansible_collections.torchherd.cluster.plugins.filter.run_state import run_state
from ansible_collections.torchherd.cluster.plugins.module_utils._use import use_of
from ansible_collections.torchherd.cluster.plugins.plugin_utils._answers import answer

DOCUMENTATION = r"""
name: node_results
author: torchherd developers
version_added: 0.1.0
short_description: Collect the launch results registered on each node
description:
  - Reads C(torchherd_node) (its node_rank), C(torchherd_start), C(torchherd_watch), C(torchherd_status),
    C(torchherd_stop) and C(torchherd_collect_logs) from each host's variables and returns plain
    data for C(torchherd.cluster.run_summary).
  - The job's state is the one of the answer that read the node's job last, the one with the
    newest copy of its run-state record (then the node's clock, then the later phase); a
    later phase's task that got no answer, or failed, marks the node unreachable, or gives its
    error.
  - A node lost while its job ran (C(lost) of C(torchherd.cluster.run_state), where the master's
    gang lost it) counts as unreachable (the launch did not try it again); its C(lost_at) is
    when the master saw its link close, on the controller's clock (null for other nodes).
  - C(started_at), C(ended_at) and C(first_output_at) (when a rank first wrote output, from the
    node's run-state record) are on the controller's clock, C(clock_offset) seconds behind
    the node's (from the time the node answered and the time its answer came back, see the
    action of C(torchherd.cluster.torchrun_job)), so that nodes whose clocks disagree compare
    right; C(checked_at) stays on the node's clock.
positional: _input, hostvars, nodes_dir
options:
  _input:
    description: The hosts of the run in rank order.
    type: list
    elements: str
    required: true
  hostvars:
    description: C(hostvars).
    type: dict
    required: true
  nodes_dir:
    description:
      - The run's C(nodes) directory on the controller, where collect brought each node's
        run-state record back (C(<host>/run.json)); the newest of those and the registered
        copies wins. Empty reads the registered copies only.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Summarize
  torchherd.cluster.run_summary:
    run_dir: runs/demo
    plan: "{{ torchherd_plan }}"
    results: "{{ ['node0', 'node1'] | torchherd.cluster.node_results(hostvars, 'runs/demo/nodes') }}"
"""

RETURN = r"""
_value:
  description:
    - Host name to a dict with C(node_rank), C(job_state), C(exit_code), C(unreachable),
      C(error), C(last_line), C(started_at), C(ended_at), C(first_output_at), C(checked_at),
      C(clock_offset), C(logs_fetched), C(sync).
    - C(sync) - what the sync sent to the node, C(files) and C(bytes); zero for a node that had
      the code already (its facts' C(code_current)) once the gate let the launch go on; null
      where the sync did not come to the node.
    - C(sync_ended_at) (when the node's sync sent its code, null where nothing was sent) and
      C(start_answered_at) (when the answer of the start that started its job came back) are
      the controller's times, where the sync and the start phases ended (the latest node's).
    - Where torchrun restarts the workers itself, C(attempts) (by attempt number, when each
      started here and when its ranks first said something) and C(standby_used) (a
      standby's, once it ended; else null).
    - C(warm) - where the start looked for the launcher preflight started ahead, the record's
      word on it - C(used), C(pid), C(waited) (seconds the start waited for its imports),
      C(started_at), C(ready_at) (its imports done) and C(asked_at) (the start came to it),
      on the controller's clock; or C(why) not; null where the start did not look.
    - C(use) - the node's use while the job ran, where the schedule sampled it
      (C(start.sample_every)) - C(stats) (per GPU its C(mean_util) and C(peak_memory_mib), the
      node's C(mean_cpu) and C(peak_memory_mib)), C(recent) (the last samples as taken), C(gpus),
      C(every); null where nothing was sampled.
  type: dict
"""

# The answers of torchrun_job on the node's job, in the order of the launch's phases.
_PHASES = ("torchherd_start", "torchherd_status", "torchherd_watch", "torchherd_stop")


def _plain(value):
    return value if isinstance(value, dict) else {}


def _clock_offset(res):
    """How far the node's clock is ahead of the controller's (seconds, to the return trip):
    its time when it answered against the controller's when the answer came back."""
    if res.get("checked_at") is None or res.get("received_at") is None:
        return None
    return round(float(res["checked_at"]) - float(res["received_at"]), 3)


def _shifted(at, offset):
    return at if at is None or offset is None else round(float(at) - offset, 3)


def _read_last(answers):
    """The index in _PHASES of the answer that read the node's job last, or -1 where none
    did: the newest copy of the node's record it carries (its seq), then the node's own clock
    (checked_at), then the later phase."""
    read = [(int(_plain(res.get("record")).get("seq") or 0), float(res.get("checked_at") or 0),
             index) for index, res in enumerate(answers) if res.get("job_state")]
    return max(read)[2] if read else -1


def node_results(hosts, hostvars, nodes_dir=""):
    out = {}
    states = run_state(hosts, hostvars, nodes_dir)
    for host in hosts:
        hv = hostvars.get(host, {})
        entry = {"node_rank": (hv.get("torchherd_node") or {}).get("node_rank"), "job_state": None,
                 "exit_code": None, "unreachable": False, "error": None, "last_line": "",
                 "started_at": None, "ended_at": None, "checked_at": None, "clock_offset": None,
                 "logs_fetched": False}
        # The job's state as the node answered it last; an answer of a later phase without
        # one (no answer over SSH, a failed task) says what came after.
        answers = [answer(hv, key) for key in _PHASES]
        last = _read_last(answers)
        for res in reversed(answers[last + 1:]):
            if res.get("unreachable"):
                entry["unreachable"] = True
                entry["error"] = (res.get("msg") or "unreachable").strip().splitlines()[0]
            elif res.get("failed"):
                entry["error"] = str(res.get("msg"))[:500]
        if last >= 0:
            res = answers[last]
            # The node's times on the controller's clock: nodes' clocks may be minutes
            # apart, and the first node to fail is found by comparing them.
            offset = _clock_offset(res)
            entry.update(job_state=res["job_state"], exit_code=res.get("exit_code"),
                         last_line=res.get("last_line") or "",
                         started_at=_shifted(res.get("started_at"), offset),
                         ended_at=_shifted(res.get("ended_at"), offset),
                         checked_at=res.get("checked_at"), clock_offset=offset)
        # When a rank first said something there (the record's; the node's clock), and in each
        # attempt where torchrun restarts the workers itself; whether a standby took part.
        job = _plain(states[host]["record"].get("job"))
        entry["first_output_at"] = _shifted(job.get("first_output_at"), entry["clock_offset"])
        entry["attempts"] = {
            attempt: {key: _shifted(_plain(times).get(key), entry["clock_offset"])
                      for key in ("started_at", "output_at")}
            for attempt, times in _plain(job.get("attempts")).items()}
        entry["standby_used"] = _plain(job.get("standby")).get("used")
        # The node's use while the job ran: the stats of its samples and the recent ones (the
        # newest copy of its record: the one collect brought back keeps the whole course).
        entry["use"] = use_of(_plain(states[host]["record"].get("use")))
        # Whether the launcher preflight started ahead ran the job (the schedule's start.warm),
        # and when it started, was done with its imports and was asked for the job.
        warm = dict(_plain(job.get("warm")))
        for key in ("started_at", "ready_at", "asked_at"):
            if key in warm:
                warm[key] = _shifted(warm[key], entry["clock_offset"])
        entry["warm"] = warm or None
        collect = _plain(hv.get("torchherd_collect_logs"))
        if "results" in collect:  # the collect role's loop: the run directory comes first
            collect = _plain((collect["results"] or [{}])[0]) or collect
        entry["logs_fetched"] = bool(collect) and not collect.get("unreachable") \
            and "count" in collect
        if collect.get("unreachable"):
            entry["unreachable"] = True
        if states[host]["lost"] and entry["job_state"] in (None, "running"):
            entry["unreachable"] = True
            entry["error"] = entry["error"] or states[host]["lost_why"]
        sync = _plain(hv.get("torchherd_sync"))
        # The node had the code already (its facts' code_current), and the gate let the launch
        # go on to the sync: the sync role ended there without a copy.
        if not sync and _plain(hv.get("torchherd_facts")).get("code_current") \
                and _plain(hv.get("torchherd_gate")).get("ok"):
            entry["sync"] = {"files": 0, "bytes": 0}
        elif "transferred_files" in sync:
            entry["sync"] = {"files": sync["transferred_files"],
                             "bytes": sync["transferred_bytes"]}
        # Where the launch's phases ended on this node, on the controller's clock: its sync's
        # copy (none where nothing was sent) and the answer of a start that started the job.
        start = answer(hv, "torchherd_start")
        entry["sync_ended_at"] = sync.get("ended_at")
        entry["start_answered_at"] = start.get("received_at") if start.get("started") else None
        out[host] = entry
    for host, entry in out.items():
        # A lost node's moment of loss, as the master saw it, on the controller's clock.
        seen_by = states[host].get("lost_seen_by")
        entry["lost_at"] = _shifted(states[host].get("lost_at"),
                                    (out.get(seen_by) or {}).get("clock_offset"))
    return out


class FilterModule:
    """torchherd result filters."""

    def filters(self):
        return {"node_results": node_results}
