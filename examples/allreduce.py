"""All-reduce every rank's number and check the sum: the smallest proof a cluster works.

Run under torchrun (torchherd does that on every node). Every rank contributes its global rank;
the sum must be world_size * (world_size - 1) / 2 on every rank, or this exits non-zero.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fail-rank", type=int, default=-1,
                        help="raise an exception on this global rank (fault injection)")
    parser.add_argument("--fail-after", type=float, default=0.0,
                        help="seconds after the all-reduce before --fail-rank raises")
    parser.add_argument("--sleep", type=float, default=0.0,
                        help="seconds to sleep after the all-reduce (a long-running job)")
    parser.add_argument("--result-dir", default="",
                        help="local rank 0 of each node writes <dir>/allreduce-<host>.json")
    parser.add_argument("--pg-timeout", type=float, default=1800.0,
                        help="seconds a collective waits for a lost peer before failing")
    args = parser.parse_args()

    # torchherd resolves the backend in preflight; standalone runs pick it here.
    backend = os.environ.get("TORCHHERD_BACKEND") or (
        "nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    # With NCCL the process group is bound to this rank's GPU, so barrier() knows its device.
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend,
                            timeout=datetime.timedelta(seconds=args.pg_timeout),
                            device_id=device if backend == "nccl" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    node_rank = int(os.environ.get("GROUP_RANK", "-1"))
    host = socket.gethostname()
    # One write per line: ranks sharing a stream must not interleave inside a line.
    sys.stdout.write(f"torchherd-init host={host} node_rank={node_rank} local_rank={local_rank} "
                     f"rank={rank} world_size={world} t={time.time():.3f}\n")
    sys.stdout.flush()

    value = torch.tensor([float(rank)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    expected = world * (world - 1) / 2
    got = value.item()
    if got != expected:
        sys.stdout.write(f"torchherd-allreduce FAILED host={host} rank={rank} sum={got} "
                         f"expected={expected}\n")
        sys.stdout.flush()
        raise SystemExit(1)
    sys.stdout.write(f"torchherd-allreduce ok host={host} node_rank={node_rank} "
                     f"local_rank={local_rank} rank={rank} sum={got:g} expected={expected:g}\n")
    sys.stdout.flush()
    if args.result_dir and local_rank == 0:
        os.makedirs(args.result_dir, exist_ok=True)
        with open(os.path.join(args.result_dir, f"allreduce-{host}.json"), "w") as out:
            json.dump({"host": host, "node_rank": node_rank, "world_size": world, "sum": got}, out)
    if rank == args.fail_rank:
        time.sleep(args.fail_after)
        sys.stdout.write(f"torchherd-fail rank={rank} t={time.time():.3f}\n")
        sys.stdout.flush()
        raise RuntimeError(f"injected failure on rank {rank}")
    if args.sleep:
        time.sleep(args.sleep)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
