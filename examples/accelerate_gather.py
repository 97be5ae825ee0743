"""A small model trained for a few steps under Hugging Face accelerate, and a gather checked on
every process: the smallest proof that `launcher: accelerate` made one world of every node.

Every process contributes its process index; the gathered tensor must be 0..num_processes-1 on
every process, or this exits non-zero. Prints the settings accelerate took from its config
(mixed precision, gradient accumulation) so a launch with the user's config file shows them.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
from accelerate import Accelerator


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fail-rank", type=int, default=-1,
                        help="raise an exception on this process index (fault injection)")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    accelerator = Accelerator()
    index, count = accelerator.process_index, accelerator.num_processes
    host = socket.gethostname()

    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(args.steps):
        with accelerator.accumulate(model):
            inputs = torch.randn(4, 8, device=accelerator.device)
            loss = model(inputs).float().pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

    if index == args.fail_rank:
        sys.stdout.write(f"torchherd-fail rank={index} t={time.time():.3f}\n")
        sys.stdout.flush()
        raise RuntimeError(f"injected failure on process {index}")
    gathered = accelerator.gather(torch.tensor([index], device=accelerator.device))
    ok = gathered.tolist() == list(range(count))
    sys.stdout.write(
        f"torchherd-accelerate {'ok' if ok else 'FAILED'} host={host} "
        f"process_index={index} local_process_index={accelerator.local_process_index} "
        f"num_processes={count} node_rank={os.environ.get('GROUP_RANK', '-1')} "
        f"distributed_type={accelerator.distributed_type.value} "
        f"mixed_precision={accelerator.mixed_precision} "
        f"gradient_accumulation_steps={accelerator.gradient_accumulation_steps} "
        f"gathered={','.join(str(v) for v in gathered.tolist())}\n")
    sys.stdout.flush()
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The group is left and the result said; a finished process can still abort in C++
    # destructors run at the interpreter's exit ("terminate called without an active
    # exception", SIGABRT: seen on CPU nodes under load, after every process printed its
    # result). Leave without them, as examples/deepspeed_step.py does.
    os._exit(code)
