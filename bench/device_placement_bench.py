"""Reads placed on an accelerator: the reader's own placement beside a plain copy of its host output.

Run on a GPU host: ``python -m bench.device_placement_bench --snapshot=PATH`` (any
snapshot with an ``id`` column and a float ``image`` whose first value is the row's
id, as ``--write`` makes). Every step is checked on the device (the image rows
travel with their ids; every id once per epoch), then rows/s are the median of 9
epochs after a warm one, for:

- torch ``placement=reader.PlacementOptions(device="cuda")`` (copies made on the consumer's thread);
- torch ``PlacementOptions(device="cuda", prefetch_to_device=2)`` (copies ahead, on a side stream);
- the host torch output and a plain ``.to("cuda", non_blocking=True)``: the floor a placement must not fall below;
- NumPy output: the reader alone, no device;
- JAX ``PlacementOptions(sharding=...)`` over the host's devices (global ``jax.Array``s).

The machine without a GPU runs it with ``--device=cpu`` (the tests do, small), which
checks the same things with no copy to speak of. Needs only the reader's packages and
torch (JAX optional), so it runs on a GPU host without Beam or TensorFlow.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import reader


def _rows_per_second(make, check, rows: int, device: str, epochs: int = 9) -> int:
    """Median rows/s of ``epochs`` epochs after a warm one; every id once per epoch."""
    import torch

    dataset = make()
    rates = []
    for epoch in range(epochs + 1):
        seen = []
        started = time.perf_counter()
        for step in dataset:
            seen.append(check(step))
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(rows)), f"epoch {epoch}: rows not once each"
        if epoch:
            rates.append(rows / seconds)
    return round(float(np.median(rates)))


def run(snapshot: str, device: str, batch: int) -> dict:
    import torch

    rows = reader.open_snapshot(snapshot).num_rows
    figures: dict = {"device": torch.cuda.get_device_name(0) if device == "cuda" else device, "cores": os.cpu_count()}
    figures.update(rows=rows, batch=batch, torch=torch.__version__)

    def on_device(step):
        image, ids = step["image"], step["id"]
        assert image.device.type == device and ids.device.type == device, (image.device, ids.device)
        assert torch.equal(image.reshape(len(ids), -1)[:, 0].to(torch.int64), ids), "rows travel with their ids"
        return ids.cpu().numpy()

    class CopiedAfter:
        """The host torch output, each tensor then copied with a plain ``.to``; one dataset, epoch after epoch."""

        def __init__(self):
            self.host = reader.distributed_dataset(snapshot, batch, output="torch", seed=1)

        def __iter__(self):
            return ({k: v.to(device, non_blocking=True) for k, v in step.items()} for step in self.host)

    def placed(prefetch_to_device: int):
        """The reader's own torch placement on ``device``, ``prefetch_to_device`` steps ahead."""
        placement = reader.PlacementOptions(device=device, prefetch_to_device=prefetch_to_device)
        return reader.distributed_dataset(snapshot, batch, seed=1, output="torch", placement=placement)

    figures["torch_device_rows_s"] = _rows_per_second(lambda: placed(0), on_device, rows, device)
    figures["torch_prefetch_to_device_2_rows_s"] = _rows_per_second(lambda: placed(2), on_device, rows, device)
    figures["host_torch_then_to_rows_s"] = _rows_per_second(CopiedAfter, on_device, rows, device)
    figures["numpy_rows_s"] = _rows_per_second(
        lambda: reader.distributed_dataset(snapshot, batch, output="numpy", seed=1), lambda s: s["id"], rows, device
    )
    figures["torch_device_vs_host_then_to"] = round(
        figures["torch_device_rows_s"] / figures["host_torch_then_to_rows_s"], 2
    )
    try:
        import jax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
    except ImportError:
        return figures
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), PartitionSpec("data"))
    platform = "gpu" if device == "cuda" else "cpu"

    def on_mesh(step):
        assert {d.platform for d in step["image"].devices()} == {platform}, step["image"].devices()
        valid = np.asarray(step["__valid__"]).astype(bool)
        ids = np.asarray(step["id"])[valid]
        first = np.asarray(step["image"]).reshape(len(valid), -1)[:, 0].astype(np.int64)[valid]
        assert np.array_equal(first, ids), "rows travel with their ids"
        return ids

    figures["jax_sharding_rows_s"] = _rows_per_second(
        lambda: reader.distributed_dataset(
            snapshot, batch, output="jax", columns=["id", "image"], placement=reader.PlacementOptions(sharding=sharding)
        ),
        on_mesh,
        rows,
        device,
    )
    return figures


def write_snapshot(root: str, rows: int, row_floats: int) -> str:
    """``rows`` rows of an ``id`` and a random float32 ``image`` of ``row_floats`` values whose first is the id."""
    from testing.snapshots import write_snapshot

    generator = np.random.default_rng(0)
    batches = []
    for start in range(0, rows, 20_000):
        ids = np.arange(start, min(rows, start + 20_000), dtype=np.int64)
        image = generator.standard_normal((len(ids), row_floats)).astype(np.float32)
        image[:, 0] = ids
        batches.append({"id": ids, "image": image})
    return write_snapshot(root, "placement", batches)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snapshot", help="a snapshot to read; with --write, where to write one")
    parser.add_argument("--write", action="store_true", help="write the snapshot first (needs Beam)")
    parser.add_argument("--rows", type=int, default=100_000, help="with --write")
    parser.add_argument("--row_floats", type=int, default=64, help="with --write: 64 floats = 256 B rows")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--batch", type=int, default=1024)
    args = parser.parse_args(argv)
    snapshot = write_snapshot(args.snapshot, args.rows, args.row_floats) if args.write else args.snapshot
    print(json.dumps(run(snapshot, args.device, args.batch)))


if __name__ == "__main__":
    main()
