"""Elastic resume with PyTorch DDP: 2 ranks with 2 DataLoader workers each train part of an epoch and
checkpoint; the job comes back as 1 rank and finishes the epoch, every row once.

    python -m examples.elastic_resume_torch out/digits [--steps 3]

Runs on CPU (gloo on 127.0.0.1). The checkpoint holds the model and rank 0's
``loader.state_dict()``: the position of the steps the training loop received
(the workers' prefetched steps do not count), which restores on any world size
and ``num_workers`` with ``loader.load_state_dict()``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import reader
from testing.ports import free_port

GLOBAL_BATCH = 64


def train(rank: int, world: int, path: str, port: int, workers: int, steps: int, workdir: str) -> None:
    """One rank: train until ``steps`` steps (or the epoch's end), from the checkpoint if there is one."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dataset = reader.distributed_dataset(path, GLOBAL_BATCH, output="torch", seed=0, columns=["image"])
    loader = dataset.to_torch().loader(num_workers=workers)
    model = DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    checkpoint = pathlib.Path(workdir, "checkpoint.pt")
    if checkpoint.exists():
        saved = torch.load(checkpoint)
        model.module.load_state_dict(saved["model"])
        loader.load_state_dict(saved["data"])  # any world size, any num_workers
    rows = taken = 0
    for step in loader:
        features = step["image"].float().flatten(1).mean(1, keepdim=True)
        loss = model(features).square().sum()  # a sum: right for a short or empty last batch
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        rows, taken = rows + len(features), taken + 1
        if taken == steps:
            break
    if rank == 0 and taken == steps:  # the chief's checkpoint is enough: every rank is at the same step
        torch.save({"model": model.module.state_dict(), "data": loader.state_dict()}, checkpoint)
    totals = torch.tensor([rows, taken])
    dist.all_reduce(totals)
    if rank == 0:
        pathlib.Path(workdir, f"world{world}.json").write_text(json.dumps(totals.tolist()))
    dist.destroy_process_group()


def run(world: int, path: str, workers: int, steps: int, workdir: str) -> tuple[int, int]:
    """``world`` ranks in processes of their own; their rows and steps, summed."""
    args = (world, path, free_port(), workers, steps, workdir)
    torch.multiprocessing.start_processes(train, args=args, nprocs=world, start_method="spawn")
    rows, steps_taken = json.loads(pathlib.Path(workdir, f"world{world}.json").read_text())
    return rows, steps_taken // world


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot")
    parser.add_argument("--steps", type=int, default=3, help="steps the first job takes before it stops")
    args = parser.parse_args()
    total = reader.open_snapshot(args.snapshot).metadata.num_rows
    with tempfile.TemporaryDirectory() as workdir:
        before, steps = run(2, args.snapshot, 2, args.steps, workdir)
        print(f"world size 2 x 2 loader workers: {steps} steps per rank, {before} rows, then stopped")
        after, steps = run(1, args.snapshot, 0, -1, workdir)
        print(f"world size 1, resumed: {steps} steps, {after} rows")
    print(f"epoch 0: {before + after} of {total} rows")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
