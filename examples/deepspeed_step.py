"""A small model trained for a few steps by a DeepSpeed engine, and an all-reduce checked on
every rank: the smallest proof that `launcher: deepspeed` made one world of every node.

The user's DeepSpeed config is a JSON file (--deepspeed_config, as DeepSpeed's own examples take
it), else a minimal one. The optimizer is torch's SGD, handed to the engine: DeepSpeed's own
optimizers (FusedAdam, cpu_adam) compile C++ extensions on first use, which needs a compiler on
every node. Every rank contributes rank + 1; the sum must be world * (world + 1) / 2 on every
rank, or this exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import deepspeed
import torch
import torch.distributed as dist


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deepspeed_config", default="",
                        help="the DeepSpeed config file (JSON); default: micro batch 2, fp32")
    parser.add_argument("--fail-rank", type=int, default=-1,
                        help="raise an exception on this rank (fault injection)")
    parser.add_argument("--steps", type=int, default=3)
    # DeepSpeed's per-node launcher passes --local_rank to the script.
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    args = parser.parse_args()

    backend = os.environ.get("TORCHHERD_BACKEND", "gloo")
    deepspeed.init_distributed(dist_backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    config = {"train_micro_batch_size_per_gpu": 2}
    if args.deepspeed_config:
        with open(args.deepspeed_config, encoding="utf-8") as handle:
            config = json.load(handle)

    model = torch.nn.Linear(8, 1)
    engine, _optimizer, _loader, _scheduler = deepspeed.initialize(
        model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01), config=config)
    for _ in range(args.steps):
        inputs = torch.randn(engine.train_micro_batch_size_per_gpu(), 8, device=engine.device)
        loss = engine(inputs).float().pow(2).mean()
        engine.backward(loss)
        engine.step()

    if rank == args.fail_rank:
        sys.stdout.write(f"torchherd-fail rank={rank} t={time.time():.3f}\n")
        sys.stdout.flush()
        raise RuntimeError(f"injected failure on rank {rank}")
    value = torch.tensor([float(rank + 1)], device=engine.device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    ok = value.item() == expected
    sys.stdout.write(
        f"torchherd-deepspeed {'ok' if ok else 'FAILED'} host={socket.gethostname()} "
        f"node_rank={os.environ.get('CROSS_RANK', '-1')} "
        f"local_rank={args.local_rank} rank={rank} world_size={world} "
        f"micro_batch={engine.train_micro_batch_size_per_gpu()} "
        f"gradient_accumulation_steps={engine.gradient_accumulation_steps()} "
        f"sum={value.item():g} expected={expected:g}\n")
    sys.stdout.flush()
    dist.barrier()
    # Leave the group before the interpreter's exit: a gloo rank that exits with it still up
    # can abort in its shutdown while a peer still runs ("terminate called without an active
    # exception", SIGABRT), which DeepSpeed's launcher reports as exit code 250.
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Even after destroy_process_group, a rank that finished can abort in the C++ destructors
    # run at the interpreter's exit (DeepSpeed's shared-memory collectives on CPU: "terminate
    # called without an active exception", SIGABRT, after the rank printed its result). The work
    # is done and said: leave without them.
    os._exit(code)
