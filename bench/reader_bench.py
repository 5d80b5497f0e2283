"""`make bench` (reader part): snapfeed's reader vs tf.data reading a .snapshot(), vs a NumPy gather.

Three row sizes, each at least ``--megabytes`` of incompressible (random) data:
  100B:  features float32[23] + label int64                  (100 bytes)
  3KB:   image uint8[32,32,3] + features float32[16] + label  (3144 bytes)
  150KB: image uint8[224,224,3] + label                       (150536 bytes)

- snapfeed: reader.distributed_dataset(shuffle on, batch 1024, 1 replica), NumPy
  output, snapshot written by WriteSnapshot (codec AUTO: random bytes do not compress, so the
  shards are uncompressed; 1 MiB blocks; BENCH_CODEC=LZ4 forces LZ4).
- tf.data: range -> map(stateless random rows of the same shapes) -> snapshot()
  written once, then read back by the same pipeline -> shuffle(same buffer as
  our window) -> batch(1024) -> prefetch(AUTOTUNE). The data differ in value,
  not in shape, size or compressibility.
- gather: the same bytes in memory, rows gathered in a random order into
  batches of 1024 with NumPy (the memory-bandwidth reference).

Each system runs in its own process (so peak RSS is its own) over ``--epochs``
epochs, more where an epoch has few batches (150KB rows: 1.3 batches of 1024
per 200 MB) so that at least ``MIN_MEASURED_BATCHES`` batches are timed, and
on until at least ``MIN_MEASURED_SECONDS`` are timed (a 200 MB epoch of 3KB rows
takes under 0.1 s). Reported per system: elements/s and MB/s (after the first batch),
CPU-seconds per GB, time to first batch, peak RSS, RSS after each epoch.
snapfeed and gather run ``REPEATS`` times, interleaved, and the run with the
median elements/s is reported (single runs on a 2-core VM vary by about 30%);
tf.data runs once (minutes per run at 100B).

Where 2 cores cannot show the ratio to the gather that a larger host gives, each size's
"what decides it" line does: the CPU seconds per GB of the gather and of the reader's threads by
role, and the ratio they allow on the free cores, on 4, and with a core for each thread
(``what_decides``). ``--hog=N`` runs N busy-looping processes beside every run (`make bench` runs
snapfeed and gather once more beside one): the reader on a busy machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import numpy as np

from bench import proc_cpu
from testing.snapshots import SHAPES, num_rows, random_batch, row_bytes, write_random_rows

BATCH = 1024
MIN_MEASURED_BATCHES = 16
#: Fast systems run more epochs than asked until this much is timed (an epoch of 3KB rows is ~0.1 s).
MIN_MEASURED_SECONDS = 2.0
REPEATS = 3


def window_rows(size: str) -> int:
    from reader.core.options import AUTO_WINDOW_BYTES

    return max(1, AUTO_WINDOW_BYTES // row_bytes(size))


def cached_snapfeed(workdir: pathlib.Path, size: str, rows: int) -> pathlib.Path:
    """The snapshot of ``rows`` rows of ``size``, written on first use under ``workdir`` and kept (big benches)."""
    directory = workdir / f"rows-{rows}"
    path = directory / f"bench-{size}"
    if not (path / "metadata.final").exists():
        print(f"writing {rows} rows ({rows * row_bytes(size) / 1e9:.2f} GB) under {directory}", file=sys.stderr)
        directory.mkdir(parents=True, exist_ok=True)
        write_random_rows(directory, size, rows)
    return path


def make_rows_dataset(size: str, rows: int):
    """range -> map(stateless random rows of the size's shapes): the data before any snapshot."""
    import tensorflow as tf

    def make_row(i):
        row = {}
        for k, (name, (shape, dtype)) in enumerate(SHAPES[size].items()):
            seed = tf.stack([i, tf.constant(k, tf.int64)])
            if name == "label":
                row[name] = i
            elif dtype == "uint8":
                row[name] = tf.cast(tf.random.stateless_uniform(shape, seed, 0, 256, tf.int32), tf.uint8)
            else:
                row[name] = tf.random.stateless_uniform(shape, seed, dtype=tf.float32)
        return row

    return tf.data.Dataset.range(rows).map(make_row, num_parallel_calls=tf.data.AUTOTUNE)


def tf_pipeline(size: str, rows: int, snapshot_dir: str):
    return make_rows_dataset(size, rows).snapshot(snapshot_dir)


def write_tfdata(directory: pathlib.Path, size: str, rows: int) -> str:
    path = str(directory / f"tfdata-{size}")
    for _ in tf_pipeline(size, rows, path).batch(4096):
        pass
    return path


def status_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process; both reset at exec, unlike ru_maxrss."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure(batches_per_epoch, epochs: int, bytes_per_row: int) -> dict:
    """Iterates a factory of batch iterables for ``epochs`` epochs, and on while fewer than
    ``MIN_MEASURED_SECONDS`` followed the first batch; rows counted from the label column."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    first_batch, rows, rss_epochs = None, 0, []
    epoch, after_first, rows_before = 0, wall0, 0
    first_epoch = (0, 0.0, 0.0)  # rows, seconds, CPU seconds: what reading each block the first time costs
    while epoch < epochs or time.perf_counter() - after_first < MIN_MEASURED_SECONDS:
        for batch in batches_per_epoch(epoch):
            if first_batch is None:
                first_batch = time.perf_counter() - wall0
                after_first, rows_before = time.perf_counter(), rows
            rows += len(batch["label"])
        if epoch == 0:
            first_epoch = (rows, time.perf_counter() - wall0, time.process_time() - cpu0)
        rss_epochs.append(round(status_mb("VmRSS")))
        epoch += 1
    end = time.perf_counter()
    wall, cpu = end - after_first, time.process_time() - cpu0
    steady_rows = rows - rows_before - BATCH  # rows after the first batch
    gigabytes = rows * bytes_per_row / 1e9
    return {
        "elements_per_s": steady_rows / wall,
        "first_epoch_elements_per_s": first_epoch[0] / first_epoch[1],
        "later_epochs_elements_per_s": (rows - first_epoch[0]) / (end - wall0 - first_epoch[1]),
        "first_epoch_cpu_s_per_gb": first_epoch[2] / (first_epoch[0] * bytes_per_row / 1e9),
        "later_epochs_cpu_s_per_gb": (cpu - first_epoch[2]) / ((rows - first_epoch[0]) * bytes_per_row / 1e9),
        "mb_per_s": steady_rows * bytes_per_row / wall / 1e6,
        "cpu_s_per_gb": cpu / gigabytes,
        "first_batch_s": first_batch,
        "peak_rss_mb": status_mb("VmHWM"),
        "rss_after_epoch_mb": rss_epochs,
        "rows": rows,
    }


def epochs_for(rows: int, at_least: int) -> int:
    """Enough epochs that at least ``MIN_MEASURED_BATCHES`` batches follow the first one."""
    return max(at_least, math.ceil((MIN_MEASURED_BATCHES + 1) * BATCH / rows))


def run_system(system: str, size: str, rows: int, path: str, epochs: int) -> dict:
    if system == "snapfeed":
        import reader

        # BENCH_VERIFY_CHECKSUMS=blocks: what checking each block the first time it is read costs (block_checks).
        verify = {"": False, "blocks": "blocks", "full": True}[os.environ.get("BENCH_VERIFY_CHECKSUMS", "")]
        dataset = reader.distributed_dataset(
            path, BATCH, seed=0, num_epochs=1, read=reader.ReadOptions(verify_checksums=verify)
        )
        before, cpu_before = thread_roles_cpu_s(), time.process_time()
        result = measure(lambda epoch: dataset, epochs, row_bytes(size))
        gigabytes = result["rows"] * row_bytes(size) / 1e9
        result["threads_cpu_s_per_gb"] = threads_cpu_s_per_gb(before, cpu_before, gigabytes)
        result["stats_us_per_step"] = stats_seconds_per_step(next(iter(dataset))) * 1e6
        result["stats_share"] = result["stats_us_per_step"] / 1e6 / (BATCH / result["elements_per_s"])
        return result
    if system == "tf.data":
        import tensorflow as tf

        dataset = (
            tf_pipeline(size, rows, path).shuffle(window_rows(size), seed=0).batch(BATCH).prefetch(tf.data.AUTOTUNE)
        )
        return measure(lambda epoch: dataset, epochs, row_bytes(size))
    if system == "gather":
        data = {name: values for name, values in random_batch(size, 0, rows).items()}
        rng = np.random.default_rng(0)

        def epoch_batches(epoch):
            order = rng.permutation(rows)
            for start in range(0, rows, BATCH):
                index = order[start : start + BATCH]
                yield {name: values.take(index, axis=0) for name, values in data.items()}

        return measure(epoch_batches, epochs, row_bytes(size))
    raise SystemExit(f"unknown system {system}")


def thread_roles_cpu_s() -> dict[str, float]:
    """CPU seconds of this process's live threads by role: the reader's pools (``snapfeed-block``,
    ``snapfeed-io``: ``reader.core.pipeline.PassPools``) and the consumer (the main thread)."""
    roles = {"pools": 0.0, "consumer": 0.0}
    for thread in threading.enumerate():
        if thread is threading.main_thread():
            role = "consumer"
        elif thread.name.startswith(("snapfeed-block", "snapfeed-io")):
            role = "pools"
        else:
            continue
        try:
            roles[role] += proc_cpu.thread_cpu_s(thread.native_id)
        except FileNotFoundError:
            continue  # ended since listed
    return roles


def threads_cpu_s_per_gb(before: dict[str, float], cpu_before: float, gigabytes: float) -> dict[str, float]:
    """CPU seconds per GB since ``before`` by role; ``gathering`` is the rest of the process's: each
    pass's gathering thread (``snapfeed-prefetch``), which has ended by now, and threads not Python's."""
    after = thread_roles_cpu_s()
    spent = {role: after[role] - before[role] for role in after}
    spent["gathering"] = time.process_time() - cpu_before - sum(spent.values())
    return {role: seconds / gigabytes for role, seconds in spent.items()}


class _OneEpoch:
    """Steps of one epoch, as ``MeasuredIterator`` asks of a reader's iterator."""

    delivered_epoch = 0

    def __init__(self, steps) -> None:
        self._steps = steps

    def __next__(self):
        return next(self._steps)


def stats_seconds_per_step(step: dict[str, np.ndarray], repeats: int = 50_000) -> float:
    """What ``iterator.stats()``'s accounting adds to one step (``reader.core.stats``): the ``MeasuredIterator``
    around ``next()``, the step's size and conversion time noted as it is converted, and its gather timed as
    ``Gatherer.gather`` counts and samples it (one step in ``SAMPLE_EVERY`` timed with two clock reads, less the
    loader's wait for windows: none once they are loaded), against the same steps without them.
    Pool tasks are timed too, but once per block or read, not per step. Timed alone over many steps: a 1%
    difference is below what two whole runs on this machine can tell apart."""
    import collections
    import types

    from reader.core.stats import SAMPLE_EVERY, MeasuredIterator, StepClock, sized

    batches = [step]

    def plain(batches):
        return batches

    def seconds(make_steps) -> float:
        started = time.perf_counter()
        for _ in make_steps():
            pass
        return time.perf_counter() - started

    def measured():
        sizes: collections.deque = collections.deque()
        clock = StepClock()
        convert = sized(plain, sizes, clock.reader)

        loader = types.SimpleNamespace(waited=0.0)  # a WindowLoader whose windows are loaded: no wait to time
        stage = clock.reader.steps.gather

        def gathered():
            for _ in range(repeats):
                stage.steps += 1
                if (stage.steps - 1) % SAMPLE_EVERY:
                    yield batches
                    continue
                started, waited = time.perf_counter(), loader.waited
                stage.seconds += time.perf_counter() - started - (loader.waited - waited)
                stage.sampled += 1
                yield batches

        return MeasuredIterator(_OneEpoch(map(convert, gathered())), sizes, clock)

    without = min(seconds(lambda: (plain(batches) for _ in range(repeats))) for _ in range(3))
    with_stats = min(seconds(measured) for _ in range(3))
    return max(0.0, with_stats - without) / repeats


SYSTEMS = ("snapfeed", "tf.data", "gather")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100B,3KB,150KB")
    parser.add_argument("--megabytes", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workdir", default=None, help="keep data here (default: a temp dir, removed)")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help="which of snapfeed,tf.data,gather to run (without tf.data TensorFlow is not needed; its column is 'not run')",
    )
    parser.add_argument(
        "--hog",
        type=int,
        default=0,
        help="run this many busy-looping processes beside every run (the reader on a busy machine)",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--path", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        size = args.sizes
        result = run_system(args.worker, size, num_rows(size, args.megabytes), args.path, args.epochs)
        print(json.dumps(result))
        return
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    if unknown := set(args.systems.split(",")) - set(SYSTEMS):
        raise SystemExit(f"--systems: unknown {sorted(unknown)}; choose from {','.join(SYSTEMS)}")
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="snapfeed-reader-bench-"))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    results = []
    try:
        for size in args.sizes.split(","):
            rows = num_rows(size, args.megabytes)
            print(f"preparing {size}: {rows} rows, {rows * row_bytes(size) / 1e6:.0f} MB", file=sys.stderr)
            paths = {
                "snapfeed": cached_snapfeed(workdir, size, rows)
                if args.workdir
                else write_random_rows(workdir, size, rows)
            }
            if "tf.data" in systems:
                paths["tf.data"] = write_tfdata(workdir, size, rows)
            runs: dict[str, list[dict]] = {system: [] for system in systems}
            for system in [s for repeat in range(REPEATS) for s in systems if s != "tf.data" or repeat == 0]:
                command = [
                    sys.executable,
                    "-m",
                    "bench.reader_bench",
                    f"--worker={system}",
                    f"--sizes={size}",
                    f"--megabytes={args.megabytes}",
                    f"--epochs={epochs_for(rows, args.epochs)}",
                    f"--path={paths.get(system, '')}",
                ]
                with cpu_hogs(args.hog):
                    completed = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
                if completed.returncode != 0:
                    raise SystemExit(f"{system} {size} failed:\n{completed.stderr[-3000:]}")
                runs[system].append(json.loads(completed.stdout.strip().splitlines()[-1]))
            for system in systems:
                ranked = sorted(runs[system], key=lambda run: run["elements_per_s"])
                results.append({"size": size, "system": system, "runs": len(ranked), **ranked[len(ranked) // 2]})
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    report(results, args.hog)


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """``count`` processes spinning on the CPU for as long as the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def what_decides(ours: dict, gather: dict, hogs: int = 0) -> str:
    """Where 2 cores cannot show the ratio a host with more would give: CPU seconds per GB of the NumPy
    gather (N, one thread) and of each of the reader's roles (the gathering thread G, the pools that
    read and decode windows P, the consumer M). On k cores free of ``hogs`` a CPU-bound ratio is
    N / max(G, M, (G + P + M) / k): the gathering thread is the reader's critical path once the pools
    have cores of their own, and all three share the cores when they have not (the one-thread gather
    has a core either way)."""
    roles = ours["threads_cpu_s_per_gb"]
    numpy_gather, gathering, pools, consumer = (
        gather["cpu_s_per_gb"],
        roles["gathering"],
        roles["pools"],
        roles["consumer"],
    )
    cores = max(1, (os.cpu_count() or 1) - hogs)

    def ratio(k: float) -> float:
        return numpy_gather / max(gathering, consumer, (gathering + pools + consumer) / k)

    measured = ours["elements_per_s"] / gather["elements_per_s"]
    return (
        f"what decides it, CPU s per GB: NumPy gather N {numpy_gather:.2f} (one thread); snapfeed's gathering "
        f"thread G {gathering:.2f}, pools P {pools:.2f}, consumer M {consumer:.2f}; on {cores} free cores a "
        f"CPU-bound ratio is N / max(G, M, (G + P + M) / {cores}) = {ratio(cores):.2f}x (measured {measured:.2f}x); "
        f"on 4 free cores {ratio(4):.2f}x, with a core for each N / max(G, M) = {ratio(math.inf):.2f}x"
    )


def report(results: list[dict], hogs: int = 0) -> None:
    from reader.core.options import auto_reader_threads

    beside = f"; beside {hogs} busy-looping process{'es' if hogs > 1 else ''}" if hogs else ""
    sizes = dict.fromkeys(r["size"] for r in results)
    threads = ", ".join(f"{size} {auto_reader_threads(row_bytes(size))}" for size in sizes)
    print(
        f"reader: batch {BATCH}, shuffle on, 1 replica, block threads (AUTO on {os.cpu_count()} cores): "
        f"{threads}; elements/s after the first batch; one process per run; "
        f"snapfeed and gather: the median of {REPEATS} interleaved runs{beside}"
    )
    header = f"{'size':6} {'system':9} {'elem/s':>11} {'MB/s':>8} {'CPU s/GB':>9} {'1st batch':>9} {'peak RSS':>9} {'epochs':>6} {'RSS 1st->last epoch':>19} {'vs tf.data':>10} {'vs gather':>9}"
    print(header)
    by = {(r["size"], r["system"]): r for r in results}

    def versus(r: dict, system: str) -> str:
        other = by.get((r["size"], system))
        return f"{r['elements_per_s'] / other['elements_per_s']:.2f}x" if other else "not run"

    for r in results:
        print(
            f"{r['size']:6} {r['system']:9} {r['elements_per_s']:11.0f} {r['mb_per_s']:8.0f} {r['cpu_s_per_gb']:9.2f} "
            f"{r['first_batch_s']:8.3f}s {r['peak_rss_mb']:7.0f}MB {len(r['rss_after_epoch_mb']):6} "
            f"{r['rss_after_epoch_mb'][0]:>9}->{r['rss_after_epoch_mb'][-1]:<4}MB "
            f"{versus(r, 'tf.data'):>10} {versus(r, 'gather'):>9}"
        )
    checked = {"": "", "blocks": " and its CRC32C checked", "full": ", each shard's CRC32C checked first"}[
        os.environ.get("BENCH_VERIFY_CHECKSUMS", "")
    ]
    for r in results:
        if r["system"] == "snapfeed":
            print(
                f"{r['size']:6} snapfeed first epoch {r['first_epoch_elements_per_s']:.0f} elem/s (each block read the first "
                f"time{checked}, {r['first_epoch_cpu_s_per_gb']:.2f} CPU s/GB), later epochs "
                f"{r['later_epochs_elements_per_s']:.0f} elem/s ({r['later_epochs_cpu_s_per_gb']:.2f} CPU s/GB)"
            )
            print(
                f"{r['size']:6} iterator.stats() accounting: {r['stats_us_per_step']:.1f} us a step, "
                f"{r['stats_share']:.2%} of the read"
            )
            if gather := by.get((r["size"], "gather")):
                print(f"{r['size']:6} {what_decides(r, gather, hogs)}")
    out = pathlib.Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / ("reader_bench_hog.json" if hogs else "reader_bench.json")).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
