# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Where every rank of a job is: the report over the stacks read on every node."""

from __future__ import annotations

import json
import os
import time

DOCUMENTATION = r"""
name: stacks_report
author: torchherd developers
version_added: 0.2.0
short_description: Tell where every rank of a job is, and which rank is the odd one out
description:
  - Takes what M(torchherd.cluster.job_stacks) read on every node and groups the ranks by where
    their main thread is (its innermost frame). In a hung job most ranks wait in the same
    collective; the ranks elsewhere are the odd ones out and are named first, with the function
    they are in and the job's own frame that led there.
  - Returns the report, and the files for M(torchherd.cluster.run_record) with every rank's
    full stack.
positional: _input, plan
options:
  _input:
    description: Host to the result of M(torchherd.cluster.job_stacks) on that host.
    type: dict
    required: true
  plan:
    description: The run's plan (its nodes give each host's node rank).
    type: dict
    required: true
  reason:
    description: Why the stacks were read (C(hang), C(on demand)).
    type: str
    default: on demand
"""

EXAMPLES = r"""
- name: Write the report
  torchherd.cluster.run_record:
    run_dir: "runs/{{ torchherd_plan.run_id }}/stacks"
    files: "{{ (stacks_by_host | torchherd.cluster.stacks_report(torchherd_plan)).files }}"
  vars:
    stacks_by_host: "{{ dict(['node0', 'node1'] | zip(['node0', 'node1'] | map('extract', hostvars, 'stacks'))) }}"
"""

RETURN = r"""
_value:
  description:
    - C(report) (C(reason), C(at), C(ranks) with host, rank, pid, where and the job's own frame,
      C(groups) of ranks by where they are, C(odd) the ranks outside the largest group,
      C(errors) by host, C(problems) (each error once with the C(hosts) and C(ranks) that met
      it and its C(fix), null where none is known), C(flight_recorder) dumps by host,
      C(nccl_ras) by host (NCCL's RAS answer without its text - C(address), C(findings),
      C(error)), C(summary)), C(summary) (one line, with what NCCL's RAS found wrong) and
      C(files), C(<time>.json) (the report with every rank's threads) and C(<time>.txt) (the
      same for people), named by the UTC time of the report, and C(<time>.nccl-ras.txt) (RAS's
      status reports) where RAS answered.
  type: dict
"""

# The most of NCCL's RAS findings the summary line carries (the whole report is in its file).
RAS_LINE = 600
# Frames of these are the libraries' (torch's, Python's), not the job's own code.
_LIBRARY_MARKERS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}",
                    f"{os.sep}lib{os.sep}python")


def _frame_text(frame):
    if not frame:
        return "?"
    return f"{frame.get('name')} ({os.path.basename(str(frame.get('file')))}:{frame.get('line')})"


def _main_thread(threads):
    threads = threads or []
    return next((t for t in threads if t.get("main")), None) or \
        next((t for t in threads if t.get("name") == "MainThread"), None) or \
        (threads[0] if threads else None)


def _own_frame(frames):
    """The innermost frame of the job's own code (not a library's)."""
    return next((f for f in frames if not any(m in str(f.get("file")) for m in _LIBRARY_MARKERS)
                 and not str(f.get("file")).startswith("<")), None)


def _note(said, error, fix, host, rank=None):
    """One more node (and rank) where `error` was met, with its `fix`: `said` keeps one entry
    per error and fix, so that the report says each once, however many nodes and ranks met it."""
    entry = said.setdefault((error, fix), {"hosts": [], "ranks": [], "error": error, "fix": fix})
    if host not in entry["hosts"]:
        entry["hosts"].append(host)
    if rank is not None:
        entry["ranks"].append(rank)


def stacks_report(results, plan, reason="on demand"):
    ranks, errors, recorder, ras, said = [], {}, {}, {}, {}
    node_rank = {n["host"]: n["node_rank"] for n in plan.get("nodes") or []}
    for host in sorted(results, key=lambda h: node_rank.get(h, 0)):
        res = results[host] if isinstance(results[host], dict) else {}
        if res.get("unreachable") or res.get("failed") or res.get("error"):
            errors[host] = str(res.get("error") or res.get("msg") or "unreachable")[:500]
            _note(said, errors[host], res.get("fix"), host)
        if res.get("flight_recorder"):
            recorder[host] = res["flight_recorder"]
        if res.get("nccl_ras"):
            ras[host] = res["nccl_ras"]
        for proc in res.get("processes") or []:
            if proc.get("role") != "rank":
                continue
            if proc.get("error"):
                _note(said, proc["error"], proc.get("fix"), host, proc.get("rank"))
            main = _main_thread(proc.get("threads"))
            frames = (main or {}).get("frames") or []
            ranks.append({"host": host, "node_rank": node_rank.get(host), "rank": proc.get("rank"),
                          "local_rank": proc.get("local_rank"), "pid": proc.get("pid"),
                          "where": _frame_text(frames[0]) if frames else None,
                          "own": _frame_text(_own_frame(frames)) if _own_frame(frames) else None,
                          "error": proc.get("error"), "threads": proc.get("threads") or []})
    ranks.sort(key=lambda r: (r["rank"] is None, r["rank"], r["host"]))
    groups = {}
    for entry in ranks:
        if entry["where"]:
            groups.setdefault(entry["where"], []).append(entry["rank"])
    ordered = sorted(groups.items(), key=lambda item: (-len(item[1]), item[1]))
    odd = []
    if len(ordered) > 1 and len(ordered[0][1]) > len(ordered[1][1]):
        odd = [r for r in ranks if r["where"] and r["where"] != ordered[0][0]]
    report = {"reason": reason, "at": time.time(), "ranks": ranks,
              "groups": [{"where": where, "ranks": members} for where, members in ordered],
              "odd": [{k: r[k] for k in ("rank", "host", "pid", "where", "own")} for r in odd],
              "errors": errors, "problems": list(said.values()), "flight_recorder": recorder,
              "nccl_ras": {host: {k: v for k, v in found.items() if k != "text"}
                           for host, found in ras.items()}}
    summary = _summary(report)
    report["summary"] = summary
    text = _text(report, summary)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(report["at"]))
    # The report without every thread of every rank (those are in the files).
    short = dict(report, ranks=[{k: v for k, v in r.items() if k != "threads"} for r in ranks])
    files = {f"{stamp}.json": json.dumps(report, indent=1), f"{stamp}.txt": text}
    if any(found.get("text") for found in ras.values()):
        files[f"{stamp}.nccl-ras.txt"] = "".join(
            f"== NCCL RAS status from {host} ({found.get('address')})\n{found['text']}\n"
            for host, found in ras.items() if found.get("text"))
    return {"report": short, "summary": summary, "files": files}


def _ras_line(report):
    """What NCCL's RAS found wrong, in a line: the first node's answer with findings (RAS's
    view is the whole job's, so every node's answer tells the same)."""
    for host, found in report["nccl_ras"].items():
        lines = [line.strip() for section in ("Errors", "Warnings")
                 for line in (found.get("findings") or {}).get(section) or []]
        if lines:
            said = "; ".join(lines)
            return f"NCCL RAS ({host}): " + (said if len(said) <= RAS_LINE else
                                             said[:RAS_LINE - 3] + "...")
    return None


def _summary(report):
    summary = _where_summary(report)
    ras = _ras_line(report)
    return f"{summary} | {ras}" if ras else summary


def _where_summary(report):
    ranks = report["ranks"]
    why = f" ({'; '.join(_where_met(p) + ': ' + p['error'] for p in report['problems'])})" \
        if report["problems"] else ""
    if not ranks:
        return "no rank of the job found" + why
    if report["odd"]:
        odd = "; ".join(f"rank {r['rank']} on {r['host']} in {r['where']}"
                        + (f" from {r['own']}" if r["own"] and r["own"] != r["where"] else "")
                        for r in report["odd"])
        main = report["groups"][0]
        own = next((r["own"] for r in report["ranks"] if r["where"] == main["where"]), None)
        return (f"{odd}; the other {len(main['ranks'])} ranks in {main['where']}"
                + (f" from {own}" if own and own != main["where"] else ""))
    if not report["groups"]:
        return f"no stack of the {len(ranks)} ranks could be read" + why
    if len(report["groups"]) == 1:
        return f"all {len(ranks)} ranks in {report['groups'][0]['where']}"
    return "ranks in " + "; ".join(f"{g['where']}: ranks {_ranks(g['ranks'])}"
                                   for g in report["groups"])


def _ranks(members):
    return ", ".join(str(r) for r in members)


def _where_met(problem):
    """The nodes (and ranks) that met one problem of the report."""
    return ", ".join(problem["hosts"]) + (f" ranks {_ranks(problem['ranks'])}"
                                          if problem["ranks"] else "")


def _text(report, summary):
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report["at"]))
    lines = [f"stacks ({report['reason']}) at {when}: {len(report['ranks'])} ranks", summary, ""]
    for group in report["groups"]:
        lines.append(f"  {group['where']}: ranks {_ranks(group['ranks'])}")
    for problem in report["problems"]:
        lines.append(f"  {_where_met(problem)}: {problem['error']}")
        if problem["fix"]:
            lines.append(f"    fix: {problem['fix']}")
    for host, dumps in report["flight_recorder"].items():
        lines.append(f"  {host}: Flight Recorder dumps {', '.join(sorted(dumps.values()))}")
    for host, found in report["nccl_ras"].items():
        if found.get("error"):
            lines.append(f"  {host}: NCCL RAS at {found.get('address')}: no answer "
                         f"({found['error']})")
            continue
        lines.append(f"  {host}: NCCL RAS at {found.get('address')} answered"
                     + ("" if found.get("findings") else ", nothing wrong"))
        for section, found_lines in (found.get("findings") or {}).items():
            lines += [f"    {section}:"] + [f"      {line}" for line in found_lines]
    for entry in report["ranks"]:
        lines += ["", f"-- rank {entry['rank']} (local {entry['local_rank']}) on {entry['host']},"
                      f" pid {entry['pid']}" + (f": {entry['error']}" if entry["error"] else "")]
        for thread in entry["threads"]:
            lines.append(f"  thread {thread.get('name') or thread.get('thread_id')}"
                         + (" (main)" if thread.get("main") else "")
                         + (" (active)" if thread.get("active") else " (idle)"))
            lines += [f"    {_frame_text(frame)}  {frame.get('file')}"
                      for frame in thread.get("frames") or []]
    return "\n".join(lines) + "\n"


class FilterModule:
    """torchherd stack filters."""

    def filters(self):
        return {"stacks_report": stacks_report}
