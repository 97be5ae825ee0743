# Copyright: torchherd developers
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The gate's table, for people: a row of key facts per host, the interconnect's measure, the
problems and warnings in the template of common.problem, and the nodes left out."""

from __future__ import annotations


def host_rows(hosts, facts, interfaces, gpu_counts, nprocs):
    """The table's rows, one per host."""
    rows = []
    for host in hosts:
        f = facts.get(host)
        iface = interfaces.get(host) or {}
        if f:
            t = f["torch"]
            rows.append([host, f.get("hostname") or "", (f["python"].get("version") or "-"),
                         t.get("version") or "-", t.get("cuda") or "-", t.get("nccl") or "-",
                         str(gpu_counts.get(host, 0)), str(nprocs[host]),
                         f"{iface['name']} {iface['address']}" if iface else "-"])
        else:
            rows.append([host, "-", "-", "-", "-", "-", "-", str(nprocs[host]), "-"])
    return rows


def render(rows, problems, interconnect=None, warnings=(), left_out=None):
    head = ["node", "hostname", "python", "torch", "cuda", "nccl", "gpus", "procs", "interface"]
    lines = _table(head, rows)
    measure = (interconnect or {}).get("allreduce")
    if measure:
        threshold = interconnect.get("threshold_gbps")
        reused = interconnect.get("reused")
        lines += ["", f"interconnect: all-reduce bus bandwidth {measure['busbw']:.3g} GB/s, "
                      f"latency {measure['latency_us']:.0f} us ({measure['world_size']} ranks, "
                      f"{measure['bytes'] >> 20} MiB); "
                  + (f"threshold {threshold:.3g} GB/s ({interconnect['threshold_why']})"
                     if threshold else "no threshold")
                  + (f"; measured by run {reused['run_id']}" if reused else "")]
    for title, listed in (("problem(s)", problems),
                          ("warning(s), the job may start", warnings)):
        if not listed:
            continue
        lines += ["", f"{len(listed)} {title}:"]
        for p in listed:
            lines += [f"  {p['host']}: {p['check']}",
                      f"    expected: {p['expected']}",
                      f"    found:    {p['found']}",
                      f"    fix:      {p['fix']}"]
    if left_out:
        # The candidates the job does not run on (choose_nodes): why, in the problems' words.
        lines += ["", f"{len(left_out)} node(s) left out (the job runs on the nodes above):"]
        lines += [f"  {host}: {why}" for host, why in left_out.items()]
    return "\n".join(lines)


def _table(head, rows):
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    # The last column is left unpadded so long fixes do not widen every line.
    widths[-1] = 0
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*head).rstrip()] + [fmt.format(*r).rstrip() for r in rows]
