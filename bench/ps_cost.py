"""What `torchherd ps` costs at N nodes of this machine (ansible_connection=local, each its own
loopback address and root: inventories/local.ini's way): the command's wall time, and the CPU
of the driver and everything it started (ansible-playbook, its workers, the nodes' module
Pythons: the same machine, so the nodes' side is in it too).

Each node scans every process of the machine (the N nodes are one machine), so the count of
processes is recorded with each size.

    .venv/bin/python bench/ps_cost.py --sizes 8 32 --reps 3
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

REPO = Path(__file__).resolve().parents[1]


def inventory(path: Path, nodes: int, root: Path) -> None:
    lines = ["[torchherd_nodes]"]
    lines += [f"node{i} ansible_host=127.0.0.{i + 1} torchherd_root={root}/node{i}"
              for i in range(nodes)]
    lines += ["", "[torchherd_nodes:vars]", "ansible_connection=local",
              f"ansible_python_interpreter={sys.executable}", ""]
    path.write_text("\n".join(lines))


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def one(inv: Path) -> dict[str, float]:
    cpu, started = children_cpu(), time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "driver", "ps", "-i", str(inv), "--json"],
                          cwd=REPO, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - started, children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"ps failed ({done.returncode}): {done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    return {"wall": wall, "cpu": cpu, "nodes": len(doc["nodes"]),
            "runs": sum(len(n["runs"]) for n in doc["nodes"].values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" /
                                            time.strftime("%Y%m%d-%H%M%S-ps-cost.json")))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="th-ps-bench-") as tmp:
        for size in args.sizes:
            inv = Path(tmp) / f"local-{size}.ini"
            inventory(inv, size, Path(tmp) / "roots")
            one(inv)  # warm: bytecode, the SSH-less connection's first imports
            runs = [one(inv) for _rep in range(args.reps)]
            row = {"nodes": size, "reps": args.reps,
                   "processes": sum(1 for e in os.listdir("/proc") if e.isdigit()),
                   "wall_median": statistics.median(r["wall"] for r in runs),
                   "cpu_median": statistics.median(r["cpu"] for r in runs),
                   "walls": [round(r["wall"], 3) for r in runs],
                   "cpus": [round(r["cpu"], 3) for r in runs]}
            row["cpu_per_node"] = row["cpu_median"] / size
            rows.append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps({"cpus": os.cpu_count(), "rows": rows}, indent=1)
                              + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
