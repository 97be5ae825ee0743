"""What one Ansible task costs, by kind, at N hosts of this machine (ansible_connection=local):
the floor under every task a launch runs, with nothing of torchherd in it.

Each arm is a playbook of one no-op meta task (the play's own start) plus K tasks of one kind;
the arms run alternating, and the cost of a kind is the difference to the empty arm, divided by
K (per task) and by K * N (per host and task). Kinds:

- skipped: a per-host task whose condition is false (Ansible forks a worker per host to find
  that out);
- run_once: a task that runs once, on the first host;
- module: ansible.builtin.ping on every host (a module: its AnsiballZ payload, a Python per host).

CPU is the children's user + system time of each ansible-playbook run: the controller's and, for
module, the hosts' Pythons too (the same machine). The hosts' interpreter is a wrapper that adds
each module Python's own CPU time to a file, so module's row also says how much of its cost is
the node side (node_cpu_per_host_task) and how much the controller's.

    .venv/bin/python bench/task_floor.py --hosts 8 --tasks 10 --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KINDS = {
    "skipped": "      ansible.builtin.debug:\n        msg: x\n      when: false\n",
    "run_once": "      ansible.builtin.debug:\n        msg: x\n      run_once: true\n",
    "module": "      ansible.builtin.ping:\n",
}


def write(where: Path, hosts: int, tasks: int) -> None:
    python = where / "python"
    python.write_text(f"#!/bin/sh\nexec /usr/bin/time -f '%U %S' -a -o {where / 'node_cpu'} "
                      f"{sys.executable} \"$@\"\n")
    python.chmod(0o755)
    (where / "inventory.ini").write_text("[n]\n" + "".join(
        f"h{i} ansible_connection=local ansible_python_interpreter={python}\n"
        for i in range(hosts)))
    (where / "ansible.cfg").write_text(
        f"[defaults]\nforks = {max(hosts, 5)}\ninternal_poll_interval = 0.02\n")
    for kind, body in {"empty": "", **KINDS}.items():
        listed = "".join(f"    - name: t{j}\n{body}" for j in range(tasks if body else 0))
        (where / f"{kind}.yml").write_text(
            "- name: Floor\n  hosts: n\n  gather_facts: false\n  tasks:\n"
            "    - name: Start\n      ansible.builtin.meta: noop\n" + listed)


def node_cpu(where: Path) -> float:
    """The module Pythons' CPU time so far, and the file emptied."""
    path = where / "node_cpu"
    if not path.exists():
        return 0.0
    total = sum(float(x) for line in path.read_text().splitlines() for x in line.split()[:2]
                if line and line[0].isdigit())
    path.unlink()
    return total


def run(where: Path, kind: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                    "inventory.ini", f"{kind}.yml"], cwd=where, check=True,
                   env={**os.environ, "ANSIBLE_CONFIG": str(where / "ansible.cfg")},
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    if not os.access("/usr/bin/time", os.X_OK):
        sys.exit("task_floor: expected /usr/bin/time (GNU time), found none; fix: apt-get "
                 "install time")
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in ("empty", *KINDS)}
    nodes: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        write(where, args.hosts, args.tasks)
        run(where, "empty")  # warm the page cache and the bytecode
        for _ in range(args.reps):
            for kind in rows:
                node_cpu(where)
                rows[kind].append(run(where, kind))
                if kind == "module":
                    nodes.append(node_cpu(where))
    wall0 = statistics.median(w for w, _ in rows["empty"])
    cpu0 = statistics.median(c for _, c in rows["empty"])
    report = {"hosts": args.hosts, "tasks": args.tasks, "reps": args.reps,
              "load": os.getloadavg()[0], "empty": {"wall": round(wall0, 3), "cpu": round(cpu0, 3)}}
    for kind in KINDS:
        wall = statistics.median(w for w, _ in rows[kind]) - wall0
        cpu = statistics.median(c for _, c in rows[kind]) - cpu0
        report[kind] = {"wall_per_task": round(wall / args.tasks, 3),
                        "cpu_per_host_task": round(cpu / args.tasks / args.hosts, 4)}
    report["module"]["node_cpu_per_host_task"] = round(
        statistics.median(nodes) / args.tasks / args.hosts, 4)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
