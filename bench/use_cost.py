"""What sampling a node's use costs that node: the supervisor's sampler (module_utils/_use) taking
N samples as fast as it can, each written into a real run-state record, its CPU time (the
thread's and nvidia-smi's, a child process) per sample and per hour at the job's
sample_interval.

    .venv/bin/python bench/use_cost.py [--samples 400] [--interval 5] [--gpus 8]

Arms, side by side in one run: no nvidia-smi (a CPU-only node: /proc alone), and a stand-in
nvidia-smi (a shell script printing GPUS lines): what a child process per sample costs here.
The real nvidia-smi does more work per call (it asks the driver); measure it on a GPU node with
`--smi $(command -v nvidia-smi)`. Prints one JSON document."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "collection"))

from ansible_collections.torchherd.cluster.plugins.module_utils._runstate import (  # noqa: E402
    RECORD,
    write,
)
from ansible_collections.torchherd.cluster.plugins.module_utils._use import (  # noqa: E402
    Sampler,
    add,
    cpu_times,
)


def cpu_now():
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def arm(samples, smi, run_dir):
    """CPU seconds of `samples` samples, each added and written into the record."""
    paths = {"dir": str(run_dir)}
    sampler = Sampler(1.0, lambda use: write(paths, "use", **use), smi=smi)
    before, wall = cpu_now(), time.monotonic()
    cpu = cpu_times()
    for _ in range(samples):
        point, cpu = sampler.sample(cpu)
        sampler.use = add(sampler.use, point)
        write(paths, "use", **sampler.use)
    after = cpu_now()
    return {"self_s": after[0] - before[0], "children_s": after[1] - before[1],
            "wall_s": time.monotonic() - wall,
            "record_bytes": os.path.getsize(os.path.join(run_dir, RECORD))}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--smi", default="", help="a real nvidia-smi to measure (a GPU node)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp) / "nvidia-smi"
        fake.write_text("#!/bin/sh\n" + "".join(
            f"printf '{i}, 97, 40213, 81559\\n'\n" for i in range(args.gpus)))
        fake.chmod(0o755)
        arms = {"cpu_only": "", "stand_in_smi": str(fake)}
        if args.smi:
            arms["nvidia_smi"] = args.smi
        results = {}
        for name, smi in arms.items():
            run_dir = Path(tmp) / name
            run_dir.mkdir()
            got = arm(args.samples, smi, run_dir)
            per_sample = (got["self_s"] + got["children_s"]) / args.samples
            got.update(per_sample_ms=round(per_sample * 1000, 3),
                       cpu_s_per_hour=round(per_sample * 3600 / args.interval, 2))
            results[name] = got
    print(json.dumps({"samples": args.samples, "interval_s": args.interval, "gpus": args.gpus,
                      "machine": os.uname().nodename, "cores": os.cpu_count(),
                      "arms": results}, indent=1))


if __name__ == "__main__":
    main()
