"""A small DDP training run that checkpoints every epoch and resumes from the last checkpoint.

Rank 0 writes <ckpt-dir>/last.pt after every epoch; on start, rank 0 reads it (when present)
and broadcasts the state, so nodes without a shared file system resume together. Prints
"torchherd-train start_epoch=N" once and "torchherd-train epoch=E loss=L" per epoch (rank 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def say(text: str) -> None:
    sys.stdout.write(f"torchherd-train {text}\n")
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--ckpt-dir", default="checkpoints")
    parser.add_argument("--epoch-seconds", type=float, default=0.0,
                        help="extra time per epoch, to make a run long enough to stop")
    parser.add_argument("--samples", type=int, default=512)
    args = parser.parse_args()

    # torchherd resolves the backend in preflight; standalone runs pick it here.
    backend = os.environ.get("TORCHHERD_BACKEND") or (
        "nccl" if torch.cuda.is_available() else "gloo")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # NCCL works on GPU tensors only: each rank takes the GPU of its local rank.
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    # y = 3x + 1 with noise: a model that visibly learns in a few epochs.
    x = torch.randn(args.samples, 1)
    data = TensorDataset(x, 3 * x + 1 + 0.01 * torch.randn_like(x))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    model = DistributedDataParallel(torch.nn.Linear(1, 1).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    ckpt = os.path.join(args.ckpt_dir, "last.pt")
    state = [None]
    if rank == 0 and os.path.exists(ckpt):
        state[0] = torch.load(ckpt, weights_only=True, map_location="cpu")
    dist.broadcast_object_list(state, src=0)
    start_epoch = 0
    if state[0] is not None:
        model.module.load_state_dict(state[0]["model"])
        optimizer.load_state_dict(state[0]["optimizer"])
        start_epoch = state[0]["epoch"] + 1
    if rank == 0:
        say(f"start_epoch={start_epoch} world_size={world}")

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        total, count = torch.zeros(1, device=device), torch.zeros(1, device=device)
        for features, target in loader:
            features, target = features.to(device), target.to(device)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(features), target)
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(features)
            count += len(features)
        dist.all_reduce(total)
        dist.all_reduce(count)
        time.sleep(args.epoch_seconds)
        if rank == 0:
            os.makedirs(args.ckpt_dir, exist_ok=True)
            tmp = ckpt + ".tmp"
            torch.save({"epoch": epoch, "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict()}, tmp)
            os.replace(tmp, ckpt)
            say(f"epoch={epoch} loss={(total / count).item():.5f}")
        dist.barrier()
    if rank == 0:
        say(f"done epochs={args.epochs}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
