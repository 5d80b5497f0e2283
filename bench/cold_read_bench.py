"""`make bench` (cold reads): one epoch of a ~6.3 GB snapshot on a cold page cache, vs `cat` of its shards.

Workload: the reader bench's 3KB rows (image uint8[32,32,3] + features float32[16] + label),
``--rows`` rows (default 2,000,000: 6.3 GB in 24 shards of ~256 MiB, 1 MiB blocks, uncompressed
random bytes), written once by WriteSnapshot under ``out/cold-read-bench/`` (ignored by git) and
reused by later runs.

Before each cold system the page cache is dropped (``sync; echo 3 > /proc/sys/vm/drop_caches``,
so this needs root; without it the run stops rather than report warm numbers as cold). Systems, each
in its own process (peak RSS is its own):

- cat: ``cat`` of every shard to /dev/null, one after another: the sequential-read reference.
- pread: every 1 MiB of every shard read once with ``pread`` in a random order by as many threads
  as the reader has I/O threads (AUTO 32): what the disk serves to many outstanding random reads,
  the reader's access pattern without any decoding or gathering.
- snapfeed: ``reader.distributed_dataset(path, 1024, seed=0, num_epochs=1)``, shuffled, NumPy
  output, one epoch; every row counted once (labels are the row ids).
- fetched: the same with ``SNAPFEED_DIRECT_READS=0``: every block read whole by coalesced reads on the
  I/O pool and decoded by Arrow, instead of read directly into the window buffers.
- snapfeed-warm, fetched-warm: the same in a new process after the shards were read into the page
  cache (the warm reference: cold reads must not have been bought with a slower warm path).
- tf.data (``--tfdata``): the reader bench's tf.data ``snapshot()`` of the same shapes and size,
  written once beside it, read back cold: shuffle(same window) -> batch(1024) -> prefetch.

Reported: GB/s over the whole epoch (open and first batch included), seconds to the first batch,
peak RSS, and the ratio to cat. Systems run ``--repeats`` times interleaved (median reported):
the disk is shared and cold reads vary from run to run.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

from bench import runs
from bench.reader_bench import cached_snapfeed, status_mb, tf_pipeline, window_rows, write_tfdata
from testing.snapshots import row_bytes

SIZE = "3KB"
BATCH = 1024
DEFAULT_ROWS = 2_000_000
WORKDIR = pathlib.Path(__file__).resolve().parent.parent / "out" / "cold-read-bench"


def drop_page_cache() -> None:
    """Cold reads for the next system: dirty pages written, then every clean page dropped."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as control:
            control.write("3\n")
    except OSError as exc:
        raise SystemExit(f"cannot drop the page cache ({exc}); run the cold-read bench as root") from None


def snapshot_for(rows: int) -> str:
    return str(cached_snapfeed(WORKDIR, SIZE, rows))


def tfdata_for(rows: int) -> str:
    directory = WORKDIR / f"rows-{rows}"
    path = directory / f"tfdata-{SIZE}"
    marker = directory / "tfdata.done"
    if not marker.exists():
        print(f"writing the tf.data snapshot of {rows} rows under {directory}", file=sys.stderr)
        write_tfdata(directory, SIZE, rows)
        marker.write_text("ok\n")
    return str(path)


def shard_files(path: str) -> list[str]:
    import reader

    snapshot = reader.open_snapshot(path)
    return [snapshot.shard_path(index) for index in range(snapshot.num_shards)]


def run_cat(path: str) -> dict:
    files = shard_files(path)
    started = time.perf_counter()
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    seconds = time.perf_counter() - started
    size = sum(os.path.getsize(f) for f in files)
    return {"gb_per_s": size / seconds / 1e9, "seconds": seconds, "bytes": size}


def run_pread(path: str) -> dict:
    import concurrent.futures
    import random

    from reader.core.options import AUTO_IO_THREADS

    files = shard_files(path)
    chunk = 1 << 20
    reads = [(name, offset) for name in files for offset in range(0, os.path.getsize(name), chunk)]
    random.Random(0).shuffle(reads)
    fds = {name: os.open(name, os.O_RDONLY) for name in files}
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(AUTO_IO_THREADS) as pool:
        size = sum(pool.map(lambda read: len(os.pread(fds[read[0]], chunk, read[1])), reads))
    seconds = time.perf_counter() - started
    return {"gb_per_s": size / seconds / 1e9, "seconds": seconds, "bytes": size}


def run_epoch(batches, rows_expected: int | None) -> dict:
    started = time.perf_counter()
    first, rows, seen = None, 0, None
    for batch in batches:
        labels = batch["label"]
        labels = labels.numpy() if hasattr(labels, "numpy") else labels
        if first is None:
            first = time.perf_counter() - started
            if rows_expected is not None:
                import numpy as np

                seen = np.zeros(rows_expected, dtype=np.uint8)
        if seen is not None:
            seen[labels] += 1
        rows += len(labels)
    seconds = time.perf_counter() - started
    result = {
        "gb_per_s": rows * row_bytes(SIZE) / seconds / 1e9,
        "seconds": seconds,
        "first_batch_s": first,
        "peak_rss_mb": status_mb("VmHWM"),
        "rows": rows,
    }
    if seen is not None:
        result["every_row_once"] = bool((seen == 1).all())
    return result


def worker(system: str, path: str, rows: int) -> dict:
    if system == "cat":
        return run_cat(path)
    if system == "pread":
        return run_pread(path)
    if system in ("snapfeed", "snapfeed-warm", "fetched", "fetched-warm"):
        if system.startswith("fetched"):
            os.environ["SNAPFEED_DIRECT_READS"] = "0"
        import reader

        return run_epoch(reader.distributed_dataset(path, BATCH, seed=0, num_epochs=1), rows)
    if system == "tf.data":
        import tensorflow as tf

        dataset = tf_pipeline(SIZE, rows, path).shuffle(window_rows(SIZE), seed=0).batch(BATCH)
        return run_epoch(dataset.prefetch(tf.data.AUTOTUNE), None)
    raise SystemExit(f"unknown system {system}")


def main() -> None:
    args = runs.arguments(
        __doc__,
        ("cat", "pread", "snapfeed", "fetched", "snapfeed-warm", "fetched-warm"),
        [
            ("--rows", {"type": int, "default": DEFAULT_ROWS}),
            ("--tfdata", {"action": "store_true", "help": "also read the tf.data snapshot (written once)"}),
        ],
    )
    if args.worker:
        print(json.dumps(worker(args.worker, args.path, args.rows)))
        return
    systems = args.systems.split(",") + (["tf.data"] if args.tfdata else [])
    paths = {system: snapshot_for(args.rows) for system in systems}
    if "tf.data" in systems:
        paths["tf.data"] = tfdata_for(args.rows)
    by_system: dict[str, list[dict]] = {system: [] for system in systems}
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    for repeat in range(args.repeats):
        for system in systems:
            if system == "tf.data" and repeat:
                continue  # minutes per run; once is enough for a reference
            if system.endswith("-warm"):
                subprocess.run(["cat", *shard_files(paths[system])], stdout=subprocess.DEVNULL, check=True)
            else:
                drop_page_cache()
            command = [sys.executable, "-m", "bench.cold_read_bench", f"--worker={system}", f"--path={paths[system]}"]
            command.append(f"--rows={args.rows}")
            completed = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if completed.returncode != 0:
                raise SystemExit(f"{system} failed:\n{completed.stderr[-3000:]}")
            result = json.loads(completed.stdout.strip().splitlines()[-1])
            print(f"{system} run {repeat + 1}: {json.dumps(result)}", file=sys.stderr)
            by_system[system].append(result)
    report(args.rows, by_system)


def report(rows: int, runs: dict[str, list[dict]]) -> None:
    medians = {system: sorted(r, key=lambda run: run["gb_per_s"])[len(r) // 2] for system, r in runs.items() if r}
    references = {name: medians[name]["gb_per_s"] for name in ("cat", "pread") if name in medians}
    print(
        f"cold reads: {rows} rows of {row_bytes(SIZE)} B ({rows * row_bytes(SIZE) / 1e9:.1f} GB), batch {BATCH}, "
        f"shuffled; page cache dropped before each run (-warm: read into it first); median of the runs by GB/s"
    )
    print(
        f"{'system':14} {'runs':>4} {'GB/s':>6} {'vs cat':>7} {'vs pread':>8} {'1st batch':>9} {'peak RSS':>9}  every run's GB/s"
    )
    for system, result in medians.items():
        ratios = [
            f"{result['gb_per_s'] / references[name]:{width}.2f}x" if name in references else " " * (width + 1)
            for name, width in (("cat", 6), ("pread", 7))
        ]
        first = f"{result['first_batch_s']:8.2f}s" if "first_batch_s" in result else "        -"
        rss = f"{result['peak_rss_mb']:7.0f}MB" if "peak_rss_mb" in result else "        -"
        every = " ".join(f"{run['gb_per_s']:.2f}" for run in runs[system])
        print(
            f"{system:14} {len(runs[system]):4} {result['gb_per_s']:6.2f} {ratios[0]} {ratios[1]} {first} {rss}  {every}"
        )
        if any(run.get("every_row_once") is False for run in runs[system]):
            print(f"  {system}: some row was not read exactly once")
    out = pathlib.Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "cold_read_bench.json").write_text(json.dumps({"rows": rows, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
