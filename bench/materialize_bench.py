"""`make bench` (materialize part): snapfeed's Beam job vs tf.data snapshot, same input, same work.

Input: N tf.Examples {image: 3072 raw bytes (uint8[32,32,3], random so
incompressible), features: float32[16], label: int64} in TFRecord files.
Work: decode + per-batch normalization (bench/prep.py), then write a snapshot.

- snapfeed: `python -m beam_jobs.materialize` in-process on the DirectRunner:
  its default (in_memory), multi_threading with a thread per core, and
  multi_processing with 2 workers; on engines whose workers are other
  processes (``bench/engines.py``): the PortableRunner with an EXTERNAL SDK
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
process (about 0.8 s for a Beam pipeline).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import statistics
import tempfile
import time

import numpy as np

from bench import engines as engines_module

SCHEMA = """
feature { name: "image" type: BYTES shape { } }
feature { name: "features" type: FLOAT shape { dim { size: 16 } } }
feature { name: "label" type: INT shape { } }
"""


def make_input(directory: pathlib.Path, rows: int, files: int) -> list[str]:
    import tensorflow as tf

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = [str(directory / f"raw-{i:05d}.tfrecord") for i in range(files)]
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    for start in range(0, rows, 1000):
        count = min(1000, rows - start)
        images = rng.integers(0, 256, size=(count, 3072), dtype=np.uint8)
        features = rng.random((count, 16), dtype=np.float32)
        for i in range(count):
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[images[i].tobytes()])),
                        "features": tf.train.Feature(float_list=tf.train.FloatList(value=features[i])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[(start + i) % 10])),
                    }
                )
            )
            writers[(start + i) % files].write(example.SerializeToString())
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


def _interleaved_runs(
    args, work: pathlib.Path, files: list[str], snapfeed_modes: dict, seconds: dict, disk: dict
) -> int:
    """Runs every system ``args.repeats`` times, interleaved so a slow spell of the machine hits all; returns raw bytes."""
    for _ in range(args.repeats):
        tf_seconds, tf_rows = run_tfdata(files, work / "tfdata")
        assert tf_rows == args.rows
        seconds["tf.data snapshot"].append(tf_seconds)
        disk["tf.data snapshot"] = directory_bytes(work / "tfdata")
        for label, extra in snapfeed_modes.items():
            out = work / "".join(c if c.isalnum() else "_" for c in label)
            seconds[label].append(run_snapfeed(work / "raw", out, extra))
            disk[label] = directory_bytes(out)
    return sum(os.path.getsize(f) for f in files)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="runs per system; the median is reported")
    parser.add_argument("--workdir", default=None, help="default: a temp dir, removed afterwards")
    parser.add_argument("--json", default="bench/results/materialize.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="snapfeed-bench-"))
    cores = os.cpu_count() or 1
    snapfeed_modes = {
        "snapfeed DirectRunner default (in_memory)": [],
        f"snapfeed DirectRunner multi_threading x{cores}": [
            "--direct_running_mode=multi_threading",
            f"--direct_num_workers={cores}",
        ],
        "snapfeed DirectRunner multi_processing x2": [
            "--direct_running_mode=multi_processing",
            "--direct_num_workers=2",
        ],
    }
    engines = {
        "snapfeed PortableRunner, EXTERNAL worker pool": (engines_module.worker_pool, engines_module.portable_flags),
        "snapfeed DaskRunner, 2 worker processes": (engines_module.dask_cluster, engines_module.dask_flags),
    }
    labels = [*snapfeed_modes, *engines]
    seconds: dict[str, list[float]] = {"tf.data snapshot": [], **{label: [] for label in labels}}
    disk: dict[str, int] = {}
    try:
        with contextlib.ExitStack() as stack:
            for label, (start, flags) in engines.items():
                snapfeed_modes[label] = flags(stack.enter_context(start()))
            files = make_input(work / "raw", args.rows, args.files)
            raw_bytes = _interleaved_runs(args, work, files, snapfeed_modes, seconds, disk)
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
