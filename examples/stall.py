"""A job that hangs the way real ones do: every rank runs a few all-reduces, then one rank
(--stall-rank) is stuck outside the collective (in stall(), e.g. a data loader or a
filesystem that never answers) while every other rank waits in the next all-reduce.

    torchherd launch -i inventories/local.ini --hang-timeout 20 -- stall.py --stall-rank 1

With --stall-rank -1 no rank stalls: the job runs --steps all-reduces, one per --interval
seconds (a healthy job to read stacks of: torchherd stacks RUN_ID)."""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def stall(seconds: float) -> None:
    time.sleep(seconds)


def step(value: torch.Tensor) -> None:
    dist.all_reduce(value)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stall-rank", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--stall-seconds", type=float, default=3600)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for i in range(args.steps):
        value = torch.ones(1)
        step(value)
        print(f"torchherd-stall rank={rank} step={i} sum={int(value.item())}", flush=True)
        time.sleep(args.interval)
    if rank == args.stall_rank:
        stall(args.stall_seconds)
    value = torch.ones(1)
    step(value)
    dist.destroy_process_group()
    print(f"torchherd-stall rank={rank} done", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
