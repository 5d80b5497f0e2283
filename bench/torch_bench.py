"""`make bench` (PyTorch part): the reader's torch output in-process vs through DataLoader workers.

Workload: the reader bench's 3KB rows (image uint8[32,32,3] + features float32[16] + label), 100,000
rows (0.31 GB, written once by WriteSnapshot under ``out/torch-bench/`` and reused: warm page cache),
global batch 1024, shuffled. Systems, each in its own process, one warm-up epoch then timed epochs
(at least ``--epochs`` and at least ``MIN_MEASURED_SECONDS``):

- numpy: ``reader.distributed_dataset(path, 1024)`` iterated in-process (the reference);
- torch: the same with ``output="torch"`` (the per-step cost of torch output over NumPy output);
- loader-0: ``DataLoader(ds.to_torch(), batch_size=None)``, no workers;
- loader-N: the same with ``num_workers=N`` (the default fork context, ``set_epoch`` each epoch),
  and loader-N-persistent with ``persistent_workers=True``; each worker's reader gathers its batches
  straight into the worker's shared-memory slots, and steps cross in them without a copy
  (``reader.outputs.shared_steps``);
- loader-N...-copied: the same with the reader gathering into its own memory (the slots no longer
  lent to it), so each step is copied into a slot: the path before the slots were lent;
- loader-N...-pickled: the same with the slots turned off in this bench, so steps cross as torch
  pickles tensors (a fresh shared-memory segment per tensor): the path before the slots.

Reported per system: rows/s over the timed epochs (worker start-up included: a loader without
persistent workers starts them every epoch), CPU seconds per GB of every process of the system
(this one, its live children read from /proc, its reaped ones from RUSAGE_CHILDREN), and the ratio
to loader-0. Systems run ``--repeats`` times interleaved; the median run (rows/s) is reported.
"""

from __future__ import annotations

import json
import pathlib
import resource
import time

from bench import proc_cpu, runs
from bench.reader_bench import cached_snapfeed
from testing.snapshots import row_bytes

SIZE = "3KB"
BATCH = 1024
ROWS = 100_000
MIN_MEASURED_SECONDS = 3.0
WORKDIR = pathlib.Path(__file__).resolve().parent.parent / "out" / "torch-bench"
SYSTEMS = (
    "numpy",
    "torch",
    "loader-0",
    "loader-1",
    "loader-1-pickled",
    "loader-1-copied",
    "loader-1-persistent",
    "loader-1-persistent-copied",
    "loader-1-persistent-pickled",
    "loader-2",
    "loader-2-pickled",
    "loader-2-persistent",
    "loader-2-persistent-copied",
)


def cpu_seconds() -> tuple[float, float]:
    """CPU time of this process, and of its children (live and reaped)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, reaped.ru_utime + reaped.ru_stime + proc_cpu.live_children_cpu_s()


def epochs_of(system: str, path: str):
    """A function of the epoch number returning that epoch's batches."""
    import reader

    if system in ("numpy", "torch"):
        dataset = reader.distributed_dataset(path, BATCH, seed=0, output=system)
        return lambda epoch: dataset
    import torch.utils.data

    if system.endswith("pickled"):
        from reader.outputs.shared_steps import WorkerRing

        WorkerRing.available = staticmethod(lambda: False)  # inherited by the forked workers
    if system.endswith("copied"):
        from reader.core.allocator import new_batch
        from reader.outputs.shared_steps import WorkerRing

        WorkerRing.allocate = lambda ring, rows, empty_batch: new_batch(rows, empty_batch)  # inherited too
    dataset = reader.distributed_dataset(path, BATCH, seed=0).to_torch()
    workers = int(system.split("-")[1])
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=workers, persistent_workers="persistent" in system
    )

    def epoch_batches(epoch: int):
        dataset.set_epoch(epoch)
        return loader

    return epoch_batches


def run_system(system: str, path: str, epochs: int) -> dict:
    batches = epochs_of(system, path)
    for _batch in batches(0):  # warm-up: imports, first windows, persistent workers started
        pass
    rows, epoch = 0, 1
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    while epoch <= epochs or time.perf_counter() - wall0 < MIN_MEASURED_SECONDS:
        for batch in batches(epoch):
            rows += len(batch["label"])
        epoch += 1
    wall = time.perf_counter() - wall0
    del batches  # persistent workers exit and are reaped: their CPU time lands in RUSAGE_CHILDREN
    (own, children), (own0, children0) = cpu_seconds(), cpu0
    gigabytes = rows * row_bytes(SIZE) / 1e9
    return {
        "rows_per_s": rows / wall,
        "cpu_s_per_gb": (own - own0 + children - children0) / gigabytes,
        "workers_cpu_s_per_gb": (children - children0) / gigabytes,
        "epochs": epoch - 1,
        "rows": rows,
    }


def conversion_us_per_step(path: str) -> float:
    """What torch output adds to a NumPy step: ``reader.outputs.adapters.step_adapter("torch", ...)`` on one full step."""
    import reader
    from reader.outputs.adapters import step_adapter

    dataset = reader.distributed_dataset(path, BATCH, seed=0)
    batch = next(iter(dataset))
    convert = step_adapter("torch", dataset._column_specs)
    repeats = 2000
    start = time.perf_counter()
    for _ in range(repeats):
        convert([batch])
    return (time.perf_counter() - start) / repeats * 1e6


def main() -> None:
    args = runs.arguments(__doc__, SYSTEMS, [("--epochs", {"type": int, "default": 3})])
    if args.worker:
        print(json.dumps(run_system(args.worker, args.path, args.epochs)))
        return
    path = str(cached_snapfeed(WORKDIR, SIZE, ROWS))
    arguments = [f"--path={path}", f"--epochs={args.epochs}"]
    results = runs.median_runs("bench.torch_bench", args.systems.split(","), args.repeats, arguments, "rows_per_s")
    report(results, conversion_us_per_step(path))


def report(results: list[dict], conversion_us: float) -> None:
    print(
        f"torch: {ROWS} rows of {SIZE}, batch {BATCH}, shuffled, warm page cache; median run; worker start-up included"
    )
    reference = next((r["rows_per_s"] for r in results if r["system"] == "loader-0"), None)
    print(f"{'system':28} {'rows/s':>9} {'CPU s/GB':>9} {'(workers)':>9} {'epochs':>6} {'vs loader-0':>11}")
    for r in results:
        ratio = f"{r['rows_per_s'] / reference:10.2f}x" if reference else ""
        print(
            f"{r['system']:28} {r['rows_per_s']:9.0f} {r['cpu_s_per_gb']:9.2f} {r['workers_cpu_s_per_gb']:9.2f} "
            f"{r['epochs']:6} {ratio:>11}"
        )
    by = {r["system"]: r for r in results}
    if "numpy" in by and "torch" in by:
        numpy, torch = by["numpy"], by["torch"]
        per_step_us = (BATCH / torch["rows_per_s"] - BATCH / numpy["rows_per_s"]) * 1e6
        print(
            f"torch output vs NumPy output: {per_step_us:+.0f} us per step of {BATCH} rows in the runs above, "
            f"{torch['cpu_s_per_gb'] - numpy['cpu_s_per_gb']:+.2f} CPU s/GB; the conversion alone "
            f"(step_adapter('torch') on one step, in this process): {conversion_us:.1f} us per step"
        )
    runs.write_results("torch_bench", [*results, {"system": "torch-conversion", "us_per_step": conversion_us}])


if __name__ == "__main__":
    main()
