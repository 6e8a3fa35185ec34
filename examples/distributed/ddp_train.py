#!/usr/bin/env python3
"""A PyTorch DistributedDataParallel job for ``torchrun`` under Trainyard.

Submit it with ``examples/distributed/ddp-job.yaml``: one launcher per replica
(``launch: per_replica``) runs ``torchrun --nnodes $NNODES --node-rank $NODE_RANK
--nproc-per-node $LOCAL_WORLD_SIZE --master-addr $MASTER_ADDR --master-port $MASTER_PORT``,
and torchrun starts one worker per GPU with RANK, LOCAL_RANK and WORLD_SIZE set.
It uses NCCL on GPUs and gloo on CPU (``--backend`` overrides), a tiny model on
random data, and saves a checkpoint every ``--checkpoint-every`` steps under
``$TRAINYARD_CHECKPOINT_DIR`` (model.pt, then the step in ``trainyard-step``), from
which the next attempt resumes (``TRAINYARD_RESUME_STEP``).  On the stop signal
it saves a checkpoint and exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--backend", default=None, help="nccl (default with GPUs) or gloo")
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    backend = args.backend or ("nccl" if cuda else "gloo")
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)

    stopping = False

    def _on_stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(getattr(signal, os.environ.get("TRAINYARD_STOP_SIGNAL", "SIGTERM")), _on_stop)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    folder = os.environ.get("TRAINYARD_CHECKPOINT_DIR", "")
    start = int(os.environ.get("TRAINYARD_RESUME_STEP") or 0)
    if start and folder and os.path.exists(os.path.join(folder, "model.pt")):
        state = torch.load(os.path.join(folder, "model.pt"), map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    if rank == 0:
        print(f"world {world} on {backend}, {'GPU ' + str(device) if cuda else 'CPU'}, from step {start}", flush=True)

    def save(step: int) -> None:
        if rank != 0 or not folder:
            return
        os.makedirs(folder, exist_ok=True)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, os.path.join(folder, "model.pt"))
        tmp = os.path.join(folder, ".trainyard-step.tmp")
        with open(tmp, "w") as f:
            f.write(f"{step}\n")
        os.replace(tmp, os.path.join(folder, "trainyard-step"))

    step = start
    while step < args.steps:
        x = torch.randn(32, 64, device=device)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        # Every rank agrees on stopping: one all-reduce of the flag per step.
        flag = torch.tensor([1.0 if stopping else 0.0], device=device)
        dist.all_reduce(flag)
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % args.checkpoint_every == 0 or flag.item() > 0:
            save(step)
        if flag.item() > 0:
            if rank == 0:
                print(f"stopping at step {step} as asked", flush=True)
            break
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
