"""A job that talks while it runs: every rank prints a numbered line every --interval seconds
for --seconds, then all ranks meet in one all-reduce. It is what the live table of a launch
shows (the job's last line, elapsed time) on a job that lasts long enough to watch.

    torchherd launch -i inventories/local.ini -- ticker.py --seconds 30
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0, help="how long to keep printing")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between lines")
    args = parser.parse_args()
    backend = os.environ.get("TORCHHERD_BACKEND") or (
        "nccl" if torch.cuda.is_available() else "gloo")
    # With NCCL the collective runs on this rank's GPU.
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" \
        else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    ticks = max(1, round(args.seconds / args.interval))
    for tick in range(1, ticks + 1):
        print(f"ticker rank {rank}/{world}: tick {tick}/{ticks}", flush=True)
        time.sleep(args.interval)
    total = torch.tensor([1.0], device=device)
    dist.all_reduce(total)  # every rank is still in the job at the end
    print(f"ticker rank {rank}: done, {int(total.item())} ranks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
