"""A small DDP training run that checkpoints every epoch and resumes from the last checkpoint.

The first process of every node (local rank 0) writes <ckpt-dir>/last.pt on its node after every
epoch (DDP keeps the weights equal on every rank), so a checkpoint outlives the loss of any one
node without a shared file system. On start, the ranks agree on the newest checkpoint any node
holds and the lowest rank holding it broadcasts it: a spare that took a lost node's place
resumes with the others. This is torchherd's resume convention: after a whole-job restart (the
job's restarts key) TORCHHERD_RESTART is 1, 2, ... and the script resumes from its own last
checkpoint; where the restarts are torchrun's own (a detached job), torchrun's
TORCHELASTIC_RESTART_COUNT counts them instead, and the script does the same. Prints
"torchherd-train start_epoch=N world_size=W restart=R" once,
"torchherd-train epoch=E loss=L" per epoch and "torchherd-train done epochs=N weights=..." (the
final weights, exactly) at the end (rank 0).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def restart_count() -> int:
    """The restart this is: torchherd's whole-job restarts, or torchrun's own (detached)."""
    return max(int(os.environ.get(name) or 0)
               for name in ("TORCHHERD_RESTART", "TORCHELASTIC_RESTART_COUNT"))


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
    writer = local_rank == 0  # one checkpoint per node
    state = [None]
    if writer and os.path.exists(ckpt):
        state[0] = torch.load(ckpt, weights_only=True, map_location="cpu")
    # The newest checkpoint any node holds, and the lowest rank that holds it.
    mine = torch.tensor([state[0]["epoch"] if state[0] is not None else -1], device=device)
    epochs = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(epochs, mine)
    newest = max(int(e.item()) for e in epochs)
    start_epoch = 0
    if newest >= 0:
        source = min(r for r, e in enumerate(epochs) if int(e.item()) == newest)
        state = state if rank == source else [None]
        dist.broadcast_object_list(state, src=source)
        model.module.load_state_dict(state[0]["model"])
        optimizer.load_state_dict(state[0]["optimizer"])
        start_epoch = newest + 1
    if rank == 0:
        say(f"start_epoch={start_epoch} world_size={world} "
            f"restart={restart_count()}")

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
        if writer:
            os.makedirs(args.ckpt_dir, exist_ok=True)
            tmp = ckpt + ".tmp"
            torch.save({"epoch": epoch, "model": model.module.state_dict(),
                        "optimizer": optimizer.state_dict()}, tmp)
            os.replace(tmp, ckpt)
        if rank == 0:
            say(f"epoch={epoch} loss={(total / count).item():.5f}")
        dist.barrier()
    if rank == 0:
        weights = ",".join(float(v).hex() for p in model.module.parameters()
                           for v in p.detach().cpu().flatten())
        say(f"done epochs={args.epochs} weights={weights}")
    # DDP holds the process group: drop it first, so that destroy_process_group ends the gloo
    # group here, while the interpreter is whole. Left to the interpreter's exit, a gloo group can
    # abort in its C++ destructors ("terminate called without an active exception", SIGABRT)
    # after the work is done.
    del model, optimizer
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The work is done and said: leave without the C++ destructors of torch's other globals,
    # which can abort the same way at the interpreter's exit.
    os._exit(code)
