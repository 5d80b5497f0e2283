"""`make bench` (JAX part): the per-step cost of the reader's JAX outputs vs its NumPy output.

Workload: the reader bench's 3KB rows (image uint8[32,32,3] + features float32[16] + label), 100,000
rows (0.31 GB, written once by WriteSnapshot under ``out/jax-bench/`` and reused; read once before
the runs: warm page cache), global batch 1024, shuffled, every column. Systems, each in its own
process with 8 host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8``, ``JAX_PLATFORMS=cpu``):

- numpy: ``reader.distributed_dataset(path, 1024)`` (the reference);
- jax: ``output="jax"`` without a sharding (``jnp.asarray`` per column, on the default device);
- sharded: ``output="jax", placement=reader.PlacementOptions(sharding=NamedSharding(Mesh(8 devices, "data"),
  P("data")))``: global arrays over the 8 devices, the last partial step padded with its ``__valid__`` mask;
- sharded-prefetch: the same with ``PlacementOptions(..., prefetch_to_device=2)`` (conversion on the prefetch
  thread).

The consumer does nothing but take the step, so the time per step is the reader's plus the output's.
Reported per system: milliseconds per step and CPU milliseconds per step over the timed epochs (one
warm-up epoch, then at least ``--epochs`` and ``MIN_MEASURED_SECONDS``), and the ratio of the time
per step to numpy's. Systems run ``--repeats`` times interleaved; the median run is reported.
Host devices share the host's memory, so this is the cost of building global arrays, not of a
host-to-device copy over PCIe.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

from bench.reader_bench import cached_snapfeed
from bench.runs import arguments, median_runs, write_results
from testing.snapshots import row_bytes

SIZE = "3KB"
BATCH = 1024
ROWS = 100_000
DEVICES = 8
MIN_MEASURED_SECONDS = 3.0
WORKDIR = pathlib.Path(__file__).resolve().parent.parent / "out" / "jax-bench"
SYSTEMS = ("numpy", "jax", "sharded", "sharded-prefetch")


def dataset_for(system: str, path: str):
    import reader

    if system == "numpy":
        return reader.distributed_dataset(path, BATCH, seed=0)
    if system == "jax":
        return reader.distributed_dataset(path, BATCH, seed=0, output="jax")
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    depth = 2 if system == "sharded-prefetch" else 0
    return reader.distributed_dataset(
        path,
        BATCH,
        seed=0,
        output="jax",
        placement=reader.PlacementOptions(sharding=sharding, prefetch_to_device=depth),
    )


def run_system(system: str, path: str, epochs: int) -> dict:
    """One warm-up epoch, then timed epochs; steps counted as they arrive."""
    import warnings

    warnings.simplefilter("ignore")  # the 64-bit label narrowed to 32 bits: the same for every JAX system
    dataset = dataset_for(system, path)
    for _ in dataset:
        pass
    cpu0, wall0, steps, timed_epochs = time.process_time(), time.perf_counter(), 0, 0
    while timed_epochs < epochs or time.perf_counter() - wall0 < MIN_MEASURED_SECONDS:
        for _ in dataset:
            steps += 1
        timed_epochs += 1
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return {
        "ms_per_step": wall / steps * 1e3,
        "cpu_ms_per_step": cpu / steps * 1e3,
        "rows_per_s": timed_epochs * ROWS / wall,
        "steps": steps,
        "epochs": timed_epochs,
    }


def warm_page_cache(path: pathlib.Path) -> None:
    for shard in sorted(path.rglob("*")):
        if shard.is_file():
            with open(shard, "rb") as source:
                while source.read(8 << 20):
                    pass


def main() -> None:
    args = arguments(__doc__, SYSTEMS)
    if args.worker:
        print(json.dumps(run_system(args.worker, args.path, args.epochs)))
        return
    path = cached_snapfeed(WORKDIR, SIZE, ROWS)
    warm_page_cache(path)
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}",
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    worker_arguments = [f"--path={path}", f"--epochs={args.epochs}"]
    results = median_runs(
        "bench.jax_bench", args.systems.split(","), args.repeats, worker_arguments, "ms_per_step", env
    )
    report(results)


def report(results: list[dict]) -> None:
    reference = next((r["ms_per_step"] for r in results if r["system"] == "numpy"), None)
    print(
        f"jax: {ROWS} rows of {row_bytes(SIZE)} B, batch {BATCH}, shuffled, warm page cache, {DEVICES} host devices; "
        f"median of {results[0]['runs']} interleaved runs, one process each"
    )
    print(f"{'system':17} {'ms/step':>8} {'CPU ms/step':>11} {'rows/s':>9} {'vs numpy':>8}")
    for r in results:
        ratio = f"{r['ms_per_step'] / reference:7.2f}x" if reference else "      -"
        print(f"{r['system']:17} {r['ms_per_step']:8.2f} {r['cpu_ms_per_step']:11.2f} {r['rows_per_s']:9.0f} {ratio}")
    write_results("jax_bench", results)


if __name__ == "__main__":
    main()
