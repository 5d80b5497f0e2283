"""Host-to-GPU feeding rate (needs a CUDA device): images/s reaching the GPU.

Workload: the torch bench's snapshot (100,000 rows of 3KB: image uint8[32,32,3] + features +
label), batch 1024, shuffled. Each system's steps are consumed on the GPU by ``--matmuls``
4096x4096 float16 matmuls per step (a stand-in for a training step; 0: feeding alone) and one
reduction over the batch's images, so a copy that is not finished shows up as waiting:

- reader-prefetch: ``reader.distributed_dataset(path, 1024, output="torch",
  placement=reader.PlacementOptions(device="cuda:0", prefetch_to_device=2))``: pinned ``non_blocking``
  copies made on a side stream two steps ahead;
- reader: the same with ``prefetch_to_device=0`` (copies on the training thread's stream);
- dataloader: the baseline, ``torch.utils.data.DataLoader`` over the same rows held in memory as a
  map-style dataset (``batch_size=1024, shuffle=True, num_workers=--workers, pin_memory=True``),
  each batch moved with ``.to("cuda:0", non_blocking=True)``.

Reported: images/s over ``--epochs`` epochs after a warm-up epoch (``torch.cuda.synchronize()``
before the clock stops), and the ratio to dataloader. Without a CUDA device it says so and stops.
Run: ``python -m bench.torch_device_feed`` (results in bench/results/torch_device_feed.json).
"""

from __future__ import annotations

import argparse
import time

from bench import runs
from bench.reader_bench import cached_snapfeed
from bench.torch_bench import BATCH, ROWS, SIZE, WORKDIR

DEVICE = "cuda:0"


class InMemoryRows:
    """A map-style dataset over the snapshot's rows, read once in stored order (the DataLoader baseline)."""

    def __init__(self, path: str) -> None:
        import numpy as np

        import reader

        batches = list(reader.distributed_dataset(path, 8192, shuffle=False))
        self.columns = {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}

    def __len__(self) -> int:
        return len(self.columns["label"])

    def __getitem__(self, index: int) -> dict:
        return {name: values[index] for name, values in self.columns.items()}


def steps_of(system: str, path: str, workers: int):
    """A function of the epoch returning that epoch's steps, each a dict of tensors on the GPU."""
    import torch

    import reader

    if system.startswith("reader"):
        depth = 2 if system == "reader-prefetch" else 0
        dataset = reader.distributed_dataset(
            path,
            BATCH,
            seed=0,
            output="torch",
            placement=reader.PlacementOptions(device=DEVICE, prefetch_to_device=depth),
        )
        return lambda epoch: dataset
    loader = torch.utils.data.DataLoader(
        InMemoryRows(path),
        batch_size=BATCH,
        shuffle=True,
        num_workers=workers,
        pin_memory=True,
        persistent_workers=workers > 0,
    )

    def epoch_steps(epoch: int):
        for batch in loader:
            yield {name: values.to(DEVICE, non_blocking=True) for name, values in batch.items()}

    return epoch_steps


def run_system(system: str, path: str, epochs: int, matmuls: int, workers: int) -> dict:
    import torch

    weights = torch.randn(4096, 4096, device=DEVICE, dtype=torch.float16)
    steps = steps_of(system, path, workers)

    def consume(step) -> torch.Tensor:
        work = weights
        for _ in range(matmuls):
            work = work @ weights
        return step["image"].float().mean() + work[0, 0]

    for step in steps(0):
        consume(step)
    torch.cuda.synchronize()
    images, start = 0, time.perf_counter()
    for epoch in range(1, epochs + 1):
        for step in steps(epoch):
            consume(step)
            images += len(step["label"])
    torch.cuda.synchronize()
    return {"system": system, "images_per_s": images / (time.perf_counter() - start), "images": images}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--matmuls", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("torch_device_feed: no CUDA device (torch.cuda.is_available() is False); nothing measured")
        runs.write_results("torch_device_feed", [{"skipped": "no CUDA device"}])
        return
    path = str(cached_snapfeed(WORKDIR, SIZE, ROWS))
    results = [
        run_system(system, path, args.epochs, args.matmuls, args.workers)
        for system in ("reader-prefetch", "reader", "dataloader")
    ]
    baseline = results[-1]["images_per_s"]
    print(
        f"GPU feeding: {torch.cuda.get_device_name(0)}, {ROWS} rows of {SIZE}, batch {BATCH}, {args.matmuls} matmuls/step"
    )
    for result in results:
        print(
            f"{result['system']:16} {result['images_per_s']:10.0f} images/s {result['images_per_s'] / baseline:6.2f}x"
        )
    runs.write_results("torch_device_feed", [{**result, "matmuls_per_step": args.matmuls} for result in results])


if __name__ == "__main__":
    main()
