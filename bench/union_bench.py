"""`make bench` (union part): a union of 3 snapshots against one snapshot holding the same rows.

``--megabytes`` (default 200) of ``--size`` rows (default 3KB: the reader bench's image uint8[32,32,3] +
features float32[16] + label), random bytes, written twice by WriteSnapshot with the same shard size
(``--shard-megabytes``, default 16) and block size (1 MiB):
- one: one snapshot holding rows 0..N-1.
- union: three snapshots holding the same N rows split in three (``reader.distributed_dataset([a, b, c], ...)``,
  ``reader.core.union``). The rows are generated in chunks seeded by their first row and the split falls between
  chunks, so both hold the same bytes.
- tf.data: the reader bench's tf.data pipeline over N rows of the same shapes (range -> map(random rows) ->
  snapshot(), read back -> shuffle(the reader's window) -> batch -> prefetch(AUTOTUNE)): the reference.

Both snapfeed systems read with ``reader.distributed_dataset(..., 1024, seed=0, num_epochs=1)`` (shuffle on,
NumPy output, 1 replica), measured as ``bench.reader_bench.measure`` does (rows after the first batch, at least
``--epochs`` epochs and ``--seconds`` seconds). Each run is a process of its own (its threads and peak RSS its
own); one and union alternate ``--repeats`` times (one, union, union, one, ...) so load elsewhere on a shared
machine falls on both alike; tf.data runs once. Reported per system: the median run's rows/s, GB/s, CPU s/GB,
first batch, threads during the read (``threading.active_count()`` and the process's OS threads, the most seen,
sampled every 8th batch) and peak RSS growth (VmHWM at the end less VmRSS before the dataset is made); the
union/one ratio of the medians and the median of the ratios of adjacent pairs. Then, over every run, the range
of those threads, RSS growths and CPU s/GB (a run unlike the others shows there), and the medians of the first
epoch's rows/s (each block read the first time: the union opens more shards), the first batch and
``distributed_dataset()`` itself. Figures go to bench/results/union_bench.json.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from bench import reader_bench, runs
from testing.snapshots import SHAPES, num_rows, random_batch, row_bytes

BATCH = reader_bench.BATCH
PARTS = 3
#: Rows generated per element of the writing pipeline (as ``testing.snapshots.write_random_rows``).
CHUNK_BYTES = 8 << 20
#: Sample the thread counts every this many batches (a /proc read is ~20 us; a 3 MB batch takes ~1 ms).
SAMPLE_EVERY = 8
SYSTEMS = ("one", "union", "tf.data")
#: Figures kept of every run, not only the median one's.
PER_RUN = (
    "elements_per_s",
    "first_epoch_elements_per_s",
    "first_batch_s",
    "cpu_s_per_gb",
    "python_threads_before",
    "os_threads_before",
    "python_threads_max",
    "os_threads_max",
    "peak_rss_growth_mb",
)
#: ... and of every snapfeed run.
PER_SNAPFEED_RUN = ("open_s",)


def chunk_starts(size: str, rows: int) -> list[int]:
    chunk = max(1, CHUNK_BYTES // row_bytes(size))
    return list(range(0, rows, chunk))


def write_rows(directory: pathlib.Path, name: str, size: str, rows: int, starts: list[int], shard_bytes: int) -> str:
    """The chunks of rows beginning at ``starts`` (of ``rows`` in all) as snapshot ``name`` under ``directory``."""
    import apache_beam as beam

    from beam_jobs import WriteSnapshot
    from schemas import columns

    chunk = max(1, CHUNK_BYTES // row_bytes(size))
    with beam.Pipeline() as pipeline:
        _ = (
            pipeline
            | beam.Create(starts, reshuffle=False)
            | beam.Map(lambda s: columns.record_batch_from_arrays(random_batch(size, s, min(chunk, rows - s))))
            | WriteSnapshot(str(directory), snapshot_name=name, shard_size_bytes=shard_bytes)
        )
    return str(directory / name)


def write_data(workdir: pathlib.Path, size: str, rows: int, shard_bytes: int) -> dict[str, list[str]]:
    """One snapshot of ``rows`` rows and ``PARTS`` holding the same rows, split between chunks (kept in
    ``workdir`` and reused when already written)."""
    starts = chunk_starts(size, rows)
    if len(starts) < PARTS:
        raise SystemExit(f"--megabytes: {rows} rows are {len(starts)} chunks of 8 MB, fewer than {PARTS} parts")
    directory = workdir / f"{size}-{rows}-shard{shard_bytes}"
    written = {}
    cuts = [len(starts) * i // PARTS for i in range(PARTS + 1)]
    groups = {"one": [("one", starts)]}
    groups["union"] = [(f"part{i}", starts[cuts[i] : cuts[i + 1]]) for i in range(PARTS)]
    for system, snapshots in groups.items():
        written[system] = []
        for name, part_starts in snapshots:
            path = directory / name
            if not (path / "metadata.final").exists():
                print(f"writing {name}: rows from {part_starts[0]}, {len(part_starts)} chunks", file=sys.stderr)
                write_rows(directory, name, size, rows, part_starts, shard_bytes)
            written[system].append(str(path))
    return written


def layout(paths: list[str]) -> dict:
    """Rows, shards and blocks of the snapshots read."""
    import reader

    snapshots = [reader.open_snapshot(path) for path in paths]
    return {
        "snapshots": len(snapshots),
        "rows": sum(s.num_rows for s in snapshots),
        "shards": sum(s.num_shards for s in snapshots),
        "blocks": sum(len(blocks) for s in snapshots for blocks in s.block_rows),
    }


def os_threads() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


class ThreadCounts:
    """The most threads seen while batches pass through ``watch``."""

    def __init__(self) -> None:
        self.python_before, self.os_before = threading.active_count(), os_threads()
        self.python_max, self.os_max = self.python_before, self.os_before
        self._batches = 0

    def watch(self, batches):
        for batch in batches:
            self._batches += 1
            if self._batches % SAMPLE_EVERY == 1:
                self.python_max = max(self.python_max, threading.active_count())
                self.os_max = max(self.os_max, os_threads())
            yield batch

    def figures(self) -> dict:
        return {
            "python_threads_before": self.python_before,
            "python_threads_max": self.python_max,
            "os_threads_before": self.os_before,
            "os_threads_max": self.os_max,
        }


def run_worker(system: str, size: str, paths: list[str], epochs: int) -> dict:
    """One run in this process: ``system`` read as the reader bench measures."""
    if system == "tf.data":
        import tensorflow as tf

        rows = int(paths[1])
        dataset = (
            reader_bench.tf_pipeline(size, rows, paths[0])
            .shuffle(reader_bench.window_rows(size), seed=0)
            .batch(BATCH)
            .prefetch(tf.data.AUTOTUNE)
        )
        threads = ThreadCounts()
        rss_before = reader_bench.status_mb("VmRSS")
        result = reader_bench.measure(lambda epoch: threads.watch(dataset), epochs, row_bytes(size))
    else:
        import reader

        source = paths[0] if system == "one" else paths
        threads = ThreadCounts()
        rss_before = reader_bench.status_mb("VmRSS")
        started = time.perf_counter()
        dataset = reader.distributed_dataset(source, BATCH, seed=0, num_epochs=1)
        opened = time.perf_counter() - started
        result = reader_bench.measure(lambda epoch: threads.watch(dataset), epochs, row_bytes(size))
        result["open_s"] = opened
        result["layout"] = layout(paths)
    result["gb_per_s"] = result["mb_per_s"] / 1e3
    result["rss_before_mb"] = rss_before
    result["peak_rss_growth_mb"] = result["peak_rss_mb"] - rss_before
    result.update(threads.figures())
    return result


def alternating(repeats: int) -> list[str]:
    """one, union, union, one, ...: each system first as often as the other."""
    order = []
    for repeat in range(repeats):
        order += ["one", "union"] if repeat % 2 == 0 else ["union", "one"]
    return order


def main() -> None:
    args = runs.arguments(
        __doc__,
        systems=SYSTEMS,
        options=[
            ("--size", {"default": "3KB", "choices": sorted(SHAPES)}),
            ("--megabytes", {"type": int, "default": 200}),
            ("--shard-megabytes", {"type": int, "default": 16}),
            ("--epochs", {"type": int, "default": 2}),
            ("--seconds", {"type": float, "default": 4.0, "help": "timed at least this long per run"}),
            ("--workdir", {"default": None, "help": "keep the snapshots here (default: a temp dir, removed)"}),
        ],
    )
    size, rows = args.size, num_rows(args.size, args.megabytes)
    epochs = reader_bench.epochs_for(rows, args.epochs)
    if args.worker:
        reader_bench.MIN_MEASURED_SECONDS = args.seconds
        print(json.dumps(run_worker(args.worker, size, args.path.split(","), epochs)))
        return
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="snapfeed-union-bench-"))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        paths = write_data(workdir, size, rows, args.shard_megabytes << 20)
        if "tf.data" in systems:
            paths["tf.data"] = [reader_bench.write_tfdata(workdir, size, rows), str(rows)]
        order = [s for s in alternating(args.repeats) if s in systems]
        if "tf.data" in systems:
            order.insert(min(2, len(order)), "tf.data")
        measured: dict[str, list[dict]] = {system: [] for system in systems}
        for system in order:
            command = [
                sys.executable,
                "-m",
                "bench.union_bench",
                f"--worker={system}",
                f"--size={size}",
                f"--megabytes={args.megabytes}",
                f"--epochs={args.epochs}",
                f"--seconds={args.seconds}",
                f"--path={','.join(paths[system])}",
            ]
            completed = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if completed.returncode != 0:
                raise SystemExit(f"{system} failed:\n{completed.stderr[-3000:]}")
            measured[system].append(json.loads(completed.stdout.strip().splitlines()[-1]))
            print(f"{system}: {measured[system][-1]['elements_per_s']:,.0f} rows/s", file=sys.stderr)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    result = summary(measured, size, rows, args)
    report(result)
    runs.write_results("union_bench", [result])


def summary(measured: dict[str, list[dict]], size: str, rows: int, args) -> dict:
    medians = {}
    for system, results in measured.items():
        ranked = sorted(results, key=lambda run: run["elements_per_s"])
        medians[system] = {"runs": len(ranked), **ranked[len(ranked) // 2]}
    result = {
        "size": size,
        "rows": rows,
        "row_bytes": row_bytes(size),
        "shard_megabytes": args.shard_megabytes,
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "median": medians,
        "rows_per_s": {system: [round(r["elements_per_s"]) for r in results] for system, results in measured.items()},
        "every_run": {
            system: {key: [r[key] for r in results] for key in PER_RUN + PER_SNAPFEED_RUN if key in results[0]}
            for system, results in measured.items()
        },
    }
    if "one" in measured and "union" in measured:
        pairs = list(zip(measured["one"], measured["union"], strict=False))
        result["union_vs_one"] = medians["union"]["elements_per_s"] / medians["one"]["elements_per_s"]
        result["pair_ratios"] = [u["elements_per_s"] / o["elements_per_s"] for o, u in pairs]
        result["union_vs_one_median_pair"] = statistics.median(result["pair_ratios"])
    return result


def report(result: dict) -> None:
    medians = result["median"]
    print(
        f"union: {result['rows']} rows of {result['size']} ({result['rows'] * result['row_bytes'] / 1e6:.0f} MB), "
        f"shards of {result['shard_megabytes']} MB, batch {BATCH}, shuffle on, 1 replica; one process per run, "
        f"one and union alternating, the median run; {result['cores']} cores, load {result['load_average']}"
    )
    print(
        f"{'system':8} {'snapshots':>9} {'shards':>6} {'blocks':>6} {'rows/s':>10} {'GB/s':>6} {'CPU s/GB':>8} "
        f"{'1st batch':>9} {'threads py/os':>13} {'peak RSS +':>10} {'runs':>4} {'vs tf.data':>10} {'vs one':>6}"
    )
    tfdata, one = medians.get("tf.data"), medians.get("one")
    for system, r in medians.items():
        shape = r.get("layout", {"snapshots": "-", "shards": "-", "blocks": "-"})
        versus_tf = f"{r['elements_per_s'] / tfdata['elements_per_s']:.2f}x" if tfdata else "not run"
        versus_one = f"{r['elements_per_s'] / one['elements_per_s']:.3f}x" if one else "-"
        print(
            f"{system:8} {shape['snapshots']:>9} {shape['shards']:>6} {shape['blocks']:>6} "
            f"{r['elements_per_s']:10,.0f} {r['gb_per_s']:6.2f} {r['cpu_s_per_gb']:8.2f} {r['first_batch_s']:8.3f}s "
            f"{r['python_threads_max']:>6}/{r['os_threads_max']:<6} {r['peak_rss_growth_mb']:8.0f}MB {r['runs']:>4} "
            f"{versus_tf:>10} {versus_one:>6}"
        )
    print("rows/s of every run, in order: " + "; ".join(f"{s} {v}" for s, v in result["rows_per_s"].items()))
    for system, every in result["every_run"].items():
        print(
            f"{system:8} every run: threads before the read py {max(every['python_threads_before'])} os "
            f"{max(every['os_threads_before'])}, during py {min(every['python_threads_max'])}-{max(every['python_threads_max'])}"
            f", os {min(every['os_threads_max'])}-{max(every['os_threads_max'])}; peak RSS growth "
            f"{min(every['peak_rss_growth_mb']):.0f}-{max(every['peak_rss_growth_mb']):.0f} MB; CPU s/GB "
            f"{min(every['cpu_s_per_gb']):.2f}-{max(every['cpu_s_per_gb']):.2f}"
        )
    for system in ("one", "union"):
        if every := result["every_run"].get(system):
            print(
                f"{system:8} first epoch (each block read the first time): median "
                f"{statistics.median(every['first_epoch_elements_per_s']):,.0f} rows/s; first batch median "
                f"{statistics.median(every['first_batch_s']) * 1e3:.0f} ms; distributed_dataset() median "
                f"{statistics.median(every['open_s']) * 1e3:.0f} ms"
            )
    if "union_vs_one" in result:
        pairs = ", ".join(f"{ratio:.3f}" for ratio in result["pair_ratios"])
        print(
            f"union / one: {result['union_vs_one']:.3f}x (medians), {result['union_vs_one_median_pair']:.3f}x "
            f"(median of the adjacent pairs: {pairs})"
        )


if __name__ == "__main__":
    main()
