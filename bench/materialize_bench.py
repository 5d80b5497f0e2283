"""`make bench` (materialize part): snapfeed's Beam job vs tf.data snapshot, same input, same work.

Input: N tf.Examples {image: 3072 raw bytes (uint8[32,32,3], random so
incompressible), features: float32[16], label: int64} in TFRecord files.
Work: decode + per-batch normalization (bench/prep.py), then write a snapshot.

- snapfeed: `python -m beam_jobs.materialize` (each run in a process of its own) on the DirectRunner:
  its default for TFRecord input (multi_threading, a thread per core), in_memory
  (the default for CSV and Parquet) and multi_processing with 2 workers; on
  engines whose workers are other
  processes (``testing/engines.py``): the PortableRunner with an EXTERNAL SDK
  worker pool (the Flink/Spark/Kubernetes worker protocol; Beam's embedded job
  service asks it for one worker) and Beam's DaskRunner on a dask.distributed
  cluster of 2 worker processes. Default codec (AUTO: LZ4 where it shrinks a
  shard by 10%, else uncompressed).
- tf.data: TFRecordDataset -> batch -> map(parse + normalize) -> snapshot()
  (default codec), iterated to the end so the snapshot is complete. Batches are
  snapshotted as batches (cheapest for tf.data: no unbatch).

Reports rows/s, seconds, disk bytes / raw bytes, and snapfeed / tf.data ratios,
from the median of ``--repeats`` interleaved runs (single runs vary by 30% on a
small machine). Wall-clock seconds include each system's start-up inside the
process (about 0.8 s for a Beam pipeline). snapfeed's shards are fsynced before
they are committed; tf.data's snapshot files are left in the page cache, so
every run starts after ``os.sync()``: the previous run's write-back would
otherwise land in the next one's time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from beam_jobs.runners.direct_runner import TFRECORD_THREADS_MAX
from testing import engines as engines_module

SCHEMA = """
feature { name: "image" type: BYTES shape { } }
feature { name: "features" type: FLOAT shape { dim { size: 16 } } }
feature { name: "label" type: INT shape { } }
"""


def make_input(directory: pathlib.Path, rows: int, files: int) -> list[str]:
    """``rows`` tf.Examples in ``files`` TFRecord files, encoded by tfx-bsl's C++ encoder from Arrow batches (a
    Python loop building tf.train.Example protos took minutes for a million)."""
    import pyarrow as pa
    import tensorflow as tf
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.coders.example_coder import RecordBatchToExamplesEncoder

    directory.mkdir(parents=True, exist_ok=True)
    encoder = RecordBatchToExamplesEncoder(text_format.Parse(SCHEMA, schema_pb2.Schema()))
    rng = np.random.default_rng(0)
    paths = [str(directory / f"raw-{i:05d}.tfrecord") for i in range(files)]
    writers = [tf.io.TFRecordWriter(p) for p in paths]

    def one_per_row(values: pa.Array, per_row: int) -> pa.Array:
        offsets = np.arange(len(values) // per_row + 1, dtype=np.int64) * per_row
        return pa.LargeListArray.from_arrays(pa.array(offsets), values)

    for start in range(0, rows, 20_000):
        count = min(20_000, rows - start)
        images = rng.integers(0, 256, size=(count, 3072), dtype=np.uint8)
        image_values = pa.array([row.tobytes() for row in images], pa.large_binary())
        batch = pa.record_batch(
            {
                "image": one_per_row(image_values, 1),
                "features": one_per_row(pa.array(rng.random(count * 16, dtype=np.float32)), 16),
                "label": one_per_row(pa.array(np.arange(start, start + count, dtype=np.int64) % 10), 1),
            }
        )
        for index, record in enumerate(encoder.encode(batch)):
            writers[(start + index) % files].write(record)
    for writer in writers:
        writer.close()
    (directory / "schema.pbtxt").write_text(SCHEMA)
    return paths


def directory_bytes(path: pathlib.Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_snapfeed(raw_dir: pathlib.Path, output: pathlib.Path, extra: list[str]) -> float:
    from beam_jobs import materialize

    shutil.rmtree(output, ignore_errors=True)
    started = time.perf_counter()
    result = materialize.run(
        [
            f"--input={raw_dir}/*.tfrecord",
            f"--schema={raw_dir}/schema.pbtxt",
            "--preprocessing_fn=bench.prep:normalize",
            f"--output={output}",
            "--progress_interval_seconds=0",
            *extra,
        ]
    )
    seconds = time.perf_counter() - started
    assert result.state == "written", result
    return seconds


def run_tfdata(files: list[str], output: pathlib.Path) -> tuple[float, int]:
    import tensorflow as tf

    from bench.prep import tf_parse_and_normalize

    shutil.rmtree(output, ignore_errors=True)
    started = time.perf_counter()
    dataset = (
        tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
        .batch(1024)
        .map(tf_parse_and_normalize, num_parallel_calls=tf.data.AUTOTUNE)
        .snapshot(str(output))
    )
    rows = 0
    for batch in dataset:
        rows += int(batch["label"].shape[0])
    seconds = time.perf_counter() - started
    return seconds, rows


def _in_own_process(system: str, work: pathlib.Path, output: pathlib.Path, extra: list[str]) -> float:
    """One run in a process of its own (a run's imports, threads and memory are not the next one's); its seconds."""
    command = [
        sys.executable,
        "-m",
        "bench.materialize_bench",
        f"--role={system}",
        f"--workdir={work}",
        f"--output={output}",
        f"--extra={json.dumps(extra)}",
    ]
    completed = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if completed.returncode != 0:
        raise SystemExit(f"{system} run failed:\n{completed.stderr[-3000:]}")
    return float(completed.stdout.strip().splitlines()[-1])


def _interleaved_runs(args, work: pathlib.Path, files: list[str], systems: dict, seconds: dict, disk: dict) -> int:
    """Runs every system ``args.repeats`` times, interleaved so a slow spell of the machine hits all, each in a
    process of its own after ``os.sync()`` (the last run's dirty pages are not written back during the next one),
    an engine's cluster up only for its own runs; returns the raw bytes."""
    for _ in range(args.repeats):
        for label, (engine, flags) in systems.items():
            out = work / "".join(c if c.isalnum() else "_" for c in label)
            system = "tfdata" if label == "tf.data snapshot" else "snapfeed"
            with engine() if engine is not None else contextlib.nullcontext() as address:
                extra = flags(address) if engine is not None else flags
                os.sync()
                seconds[label].append(_in_own_process(system, work, out, extra))
            disk[label] = directory_bytes(out)
    return sum(os.path.getsize(f) for f in files)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="runs per system; the median is reported")
    parser.add_argument("--workdir", default=None, help="default: a temp dir, removed afterwards")
    parser.add_argument("--json", default="bench/results/materialize.json")
    parser.add_argument("--role", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--output", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--extra", default="[]", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.role:
        work, output = pathlib.Path(args.workdir), pathlib.Path(args.output)
        if args.role == "tfdata":
            run_seconds, rows = run_tfdata(sorted(str(f) for f in (work / "raw").glob("*.tfrecord")), output)
        else:
            run_seconds = run_snapfeed(work / "raw", output, json.loads(args.extra))
        print(run_seconds)
        return None

    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="snapfeed-bench-"))
    cores = os.cpu_count() or 1
    default_threads = max(2, min(cores, TFRECORD_THREADS_MAX))
    systems = {
        "tf.data snapshot": (None, []),
        f"snapfeed DirectRunner default (multi_threading x{default_threads})": (None, []),
        "snapfeed DirectRunner in_memory": (None, ["--direct_running_mode=in_memory"]),
        "snapfeed DirectRunner multi_processing x2": (
            None,
            ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
        ),
        "snapfeed PortableRunner, EXTERNAL worker pool": (engines_module.worker_pool, engines_module.portable_flags),
        "snapfeed DaskRunner, 2 worker processes": (engines_module.dask_cluster, engines_module.dask_flags),
    }
    seconds: dict[str, list[float]] = {label: [] for label in systems}
    disk: dict[str, int] = {}
    try:
        files = make_input(work / "raw", args.rows, args.files)
        raw_bytes = _interleaved_runs(args, work, files, systems, seconds, disk)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    results = {label: (statistics.median(runs), disk[label]) for label, runs in seconds.items()}

    tf_rate = args.rows / results["tf.data snapshot"][0]
    report = {"rows": args.rows, "raw_bytes": raw_bytes, "systems": {}}
    print(
        f"materialize {args.rows} rows ({raw_bytes / 1e6:.0f} MB of TFRecord); median of {args.repeats} interleaved runs"
    )
    print(f"{'system':50s} {'rows/s':>10s} {'seconds':>8s} {'disk/raw':>9s} {'vs tf.data':>10s}")
    for label, (median_seconds, disk_bytes) in results.items():
        rate = args.rows / median_seconds
        report["systems"][label] = {
            "rows_per_s": rate,
            "seconds": median_seconds,
            "runs_seconds": seconds[label],
            "disk_bytes": disk_bytes,
            "disk_over_raw": disk_bytes / raw_bytes,
            "ratio_vs_tfdata": rate / tf_rate,
        }
        print(f"{label:50s} {rate:10.0f} {median_seconds:8.2f} {disk_bytes / raw_bytes:9.3f} {rate / tf_rate:9.2f}x")
    pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.json).write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
