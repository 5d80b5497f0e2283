"""`make bench` (mixture part): a mixture of 64 snapshots against one snapshot of the same rows, and tf.data's.

What issue 47 asks of the number of sources: a mixture of 64 snapshots reads with the threads and the
memory of one snapshot. Both hold the same 3KB rows (``--megabytes`` of them, random, so incompressible):
one snapshot, and 64 snapshots of a 64th each (one Beam pipeline writes them all).

- snapfeed one: ``reader.distributed_dataset(one, 1024, seed=0)``;
- snapfeed mix64: ``reader.distributed_dataset(reader.mixture({s0: ..., s63: ...}), 1024, seed=0)``
  (equal weights, an epoch of all rows);
- tf.data one / mix64: the same rows through ``tf.data`` ``snapshot()``s (written once), then
  ``shuffle`` (the reader's window) -> ``batch(1024)`` -> ``prefetch``; mix64 is
  ``Dataset.sample_from_datasets`` over the 64 snapshots, each repeated, with equal weights, taking an
  epoch's rows: what a tf.data user writes for a weighted mix.

Each runs in its own process over ``--epochs`` epochs: rows/s after the first batch, peak RSS (VmHWM),
and the most threads the process held (sampled every 10 ms). Runs alternate (one, mix64, one, mix64, ...)
``--repeats`` times; the median is reported, with the mix64/one ratios.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading

from bench.reader_bench import BATCH, measure, status_mb, tf_pipeline, window_rows
from testing.snapshots import num_rows, random_batch, row_bytes

SIZE = "3KB"
SOURCES = 64


def write_snapshots(directory: pathlib.Path, rows: int, sources: int) -> tuple[str, list[str]]:
    """One snapshot of ``rows`` rows and ``sources`` snapshots of a share each, by one Beam pipeline."""
    import apache_beam as beam

    from beam_jobs import WriteSnapshot
    from schemas import columns

    chunk = max(1, (8 << 20) // row_bytes(SIZE))
    bounds = [rows * s // sources for s in range(sources + 1)]
    with beam.Pipeline() as pipeline:

        def branch(label: str, start: int, stop: int, root: pathlib.Path, name: str):
            starts = list(range(start, stop, chunk))
            _ = (
                pipeline
                | f"{label}/starts" >> beam.Create(starts, reshuffle=False)
                | f"{label}/rows"
                >> beam.Map(
                    lambda s, stop=stop: columns.record_batch_from_arrays(random_batch(SIZE, s, min(chunk, stop - s)))
                )
                | f"{label}/write" >> WriteSnapshot(str(root), snapshot_name=name)
            )

        branch("one", 0, rows, directory / "one", "one")
        for s in range(sources):
            branch(f"s{s}", bounds[s], bounds[s + 1], directory / "mix", f"s{s:02d}")
    return str(directory / "one" / "one"), [str(directory / "mix" / f"s{s:02d}") for s in range(sources)]


def write_tfdata(directory: pathlib.Path, rows: int, sources: int) -> tuple[str, list[str]]:
    one = str(directory / "tf-one")
    for _ in tf_pipeline(SIZE, rows, one).batch(4096):
        pass
    bounds = [rows * s // sources for s in range(sources + 1)]
    parts = []
    for s in range(sources):
        parts.append(str(directory / f"tf-s{s:02d}"))
        for _ in tf_pipeline(SIZE, bounds[s + 1] - bounds[s], parts[-1]).batch(4096):
            pass
    return one, parts


class ThreadPeak:
    """The most threads this process held, sampled every 10 ms (``/proc/self/status``)."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, int(status_mb("Threads") * 1024))

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak - 1  # less the sampler


def run(system: str, paths: dict, rows: int, epochs: int) -> dict:
    if system.startswith("snapfeed"):
        import reader

        source = (
            paths["one"]
            if system == "snapfeed-one"
            else reader.mixture({f"s{s:02d}": path for s, path in enumerate(paths["mix"])})
        )
        dataset = reader.distributed_dataset(source, BATCH, seed=0, num_epochs=1)
        peak = ThreadPeak()
        result = measure(lambda epoch: dataset, epochs, row_bytes(SIZE))
    else:
        import tensorflow as tf

        if system == "tf.data-one":
            base = tf_pipeline(SIZE, rows, paths["tf_one"])
        else:
            bounds = [rows * s // SOURCES for s in range(SOURCES + 1)]  # as written: the same fingerprints
            parts = [
                tf_pipeline(SIZE, bounds[s + 1] - bounds[s], path).repeat() for s, path in enumerate(paths["tf_mix"])
            ]
            base = tf.data.Dataset.sample_from_datasets(parts, seed=0).take(rows)
        dataset = base.shuffle(window_rows(SIZE), seed=0).batch(BATCH).prefetch(tf.data.AUTOTUNE)
        peak = ThreadPeak()
        result = measure(lambda epoch: dataset, epochs, row_bytes(SIZE))
    result["threads"] = peak.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--run", help=argparse.SUPPRESS)  # a child: SYSTEM JSON-PATHS
    args = parser.parse_args()
    rows = num_rows(SIZE, args.megabytes)
    if args.run:
        system, paths = args.run.split(" ", 1)
        print(json.dumps(run(system, json.loads(paths), rows, args.epochs)))
        return
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="snapfeed-mixture-bench-"))
    print(f"writing {rows} rows of {SIZE} as one snapshot and as {SOURCES} under {workdir}", file=sys.stderr)
    one, mix = write_snapshots(workdir, rows, SOURCES)
    tf_one, tf_mix = write_tfdata(workdir, rows, SOURCES)
    paths = json.dumps({"one": one, "mix": mix, "tf_one": tf_one, "tf_mix": tf_mix})
    systems = ["snapfeed-one", "snapfeed-mix64", "tf.data-one", "tf.data-mix64"]
    results: dict[str, list[dict]] = {system: [] for system in systems}
    for repeat in range(args.repeats):
        for system in systems if repeat == 0 else systems[:2]:  # tf.data once: minutes per run
            command = [
                sys.executable,
                "-m",
                "bench.mixture_bench",
                f"--megabytes={args.megabytes}",
                f"--epochs={args.epochs}",
                "--run",
                f"{system} {paths}",
            ]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            results[system].append(json.loads(output.strip().splitlines()[-1]))
    median = {
        system: {
            key: statistics.median(run[key] for run in runs) for key in ("elements_per_s", "peak_rss_mb", "threads")
        }
        for system, runs in results.items()
        if runs
    }
    print(
        f"mixture bench: {rows} rows of {SIZE} ({rows * row_bytes(SIZE) / 1e6:.0f} MB), {SOURCES} sources, "
        f"{args.epochs} epochs, median of {args.repeats} (tf.data: 1)"
    )
    for system, values in median.items():
        print(
            f"  {system:16s} {values['elements_per_s']:>12,.0f} rows/s  peak RSS {values['peak_rss_mb']:7.0f} MB  "
            f"threads {values['threads']:4.0f}"
        )
    for side in ("snapfeed", "tf.data"):
        one, mixed = median[f"{side}-one"], median[f"{side}-mix64"]
        print(
            f"  {side} mix64/one: speed {mixed['elements_per_s'] / one['elements_per_s']:.2f}x, "
            f"RSS {mixed['peak_rss_mb'] / one['peak_rss_mb']:.2f}x, threads {mixed['threads']:.0f} vs {one['threads']:.0f}"
        )
    ours, theirs = median["snapfeed-mix64"], median["tf.data-mix64"]
    print(f"  mix64 snapfeed/tf.data: {ours['elements_per_s'] / theirs['elements_per_s']:.2f}x rows/s")
    print(json.dumps({"median": median, "runs": results}))


if __name__ == "__main__":
    main()
