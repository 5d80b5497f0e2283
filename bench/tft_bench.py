"""`make bench` (tf.Transform part): the TFX path and snapfeed's, same raw data, same tf.Transform function.

Raw data: ``--rows`` tf.Examples in TFRecord files, each {id: int64, x: float, y: float,
category: bytes (12 values of skewed frequency), features: float[16]}, with a TFMD schema.
Function (``preprocessing_fn`` below): z-score of x, 0-1 scaling of y, quartile buckets of y, a
vocabulary of category, and an element-wise z-score of the 16 features: every kind of full-pass
analyzer the job tests check.

- TFX's usual materialization: tfx-bsl's ``TFExampleRecord`` source ->
  ``tft_beam.AnalyzeAndTransformDataset(output_record_batches=True)`` -> transformed tf.Examples
  (``RecordBatchToExamplesEncoder``, as TFX's Transform component writes them) -> TFRecord files;
  read back with tf.data: ``TFRecordDataset`` (parallel reads) -> shuffle -> batch ->
  ``parse_example`` with ``transformed_feature_spec()`` -> prefetch.
- snapfeed: ``python -m beam_jobs.materialize --tft_preprocessing_fn=bench.tft_bench:preprocessing_fn``
  (the same function, the same files and schema), read with ``reader.distributed_dataset`` (shuffled).

Both jobs run on the DirectRunner in its default mode (in_memory) in their own process, one after
the other, ``--repeats`` times interleaved; the median is reported. Reads: ``--read-seconds`` of
batches of 1024 after the first batch, each reader in its own process. Reported: job seconds and
rows/s, read rows/s, and snapfeed / TFX ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import apache_beam as beam
import numpy as np

SCHEMA = """
feature { name: "id" type: INT shape { } presence { min_fraction: 1 } }
feature { name: "x" type: FLOAT shape { } presence { min_fraction: 1 } }
feature { name: "y" type: FLOAT shape { } presence { min_fraction: 1 } }
feature { name: "category" type: BYTES shape { } presence { min_fraction: 1 } }
feature { name: "features" type: FLOAT shape { dim { size: 16 } } presence { min_fraction: 1 } }
"""
CATEGORIES = [f"c{i:02d}".encode() for i in range(12)]
BATCH = 1024


def preprocessing_fn(inputs):
    """The function both paths run."""
    import tensorflow_transform as tft

    return {
        "id": inputs["id"],
        "x_z": tft.scale_to_z_score(inputs["x"]),
        "y_01": tft.scale_to_0_1(inputs["y"]),
        "y_quartile": tft.bucketize(inputs["y"], 4),
        "category_id": tft.compute_and_apply_vocabulary(inputs["category"], vocab_filename="category"),
        "features_z": tft.scale_to_z_score(inputs["features"], elementwise=True),
    }


def make_input(directory: pathlib.Path, rows: int, files: int) -> str:
    """``rows`` raw tf.Examples in ``files`` TFRecord files, and their schema; returns the input pattern.

    Encoded by tfx-bsl's C++ encoder from Arrow batches (a Python loop building tf.train.Example protos
    took 400 s for a million)."""
    import pyarrow as pa
    import tensorflow as tf
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.coders.example_coder import RecordBatchToExamplesEncoder

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "schema.pbtxt").write_text(SCHEMA)
    encoder = RecordBatchToExamplesEncoder(text_format.Parse(SCHEMA, schema_pb2.Schema()))
    rng = np.random.default_rng(0)
    frequencies = np.geomspace(1, 20, len(CATEGORIES))[::-1]
    frequencies /= frequencies.sum()

    def one_per_row(values: np.ndarray) -> pa.Array:
        per_row = values.size // len(values)
        offsets = np.arange(len(values) + 1, dtype=np.int64) * per_row
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values.reshape(-1)))

    writers = [tf.io.TFRecordWriter(str(directory / f"raw-{i:03d}.tfrecord")) for i in range(files)]
    for start in range(0, rows, 50_000):
        count = min(50_000, rows - start)
        batch = pa.record_batch(
            {
                "id": one_per_row(np.arange(start, start + count, dtype=np.int64)),
                "x": one_per_row(rng.normal(3, 2, count).astype(np.float32)),
                "y": one_per_row(rng.exponential(5, count).astype(np.float32)),
                "category": one_per_row(
                    np.array(CATEGORIES, dtype=object)[rng.choice(len(CATEGORIES), count, p=frequencies)]
                ),
                "features": one_per_row(rng.random((count, 16), dtype=np.float32)),
            }
        )
        for index, record in enumerate(encoder.encode(batch)):
            writers[(start + index) % files].write(record)
    for writer in writers:
        writer.close()
    return str(directory / "raw-*.tfrecord")


def tfx_job(pattern: str, schema_path: str, output: pathlib.Path) -> None:
    """TFX's usual materialization: Analyze and Transform, then TFRecords of transformed tf.Examples."""
    import tensorflow_transform.beam as tft_beam
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.public import tfxio

    schema = text_format.Parse(pathlib.Path(schema_path).read_text(), schema_pb2.Schema())
    source = tfxio.TFExampleRecord(pattern, schema=schema)
    with beam.Pipeline() as pipeline, tft_beam.Context(temp_dir=str(output / "tmp")):
        raw = pipeline | "Read" >> source.BeamSource()
        (transformed, metadata), transform_fn = (
            raw,
            source.TensorAdapterConfig(),
        ) | tft_beam.AnalyzeAndTransformDataset(preprocessing_fn, output_record_batches=True)
        _ = (
            transformed
            | "Encode" >> beam.ParDo(_EncodeExamples(), beam.pvalue.AsSingleton(metadata.deferred_metadata))
            | "Write" >> beam.io.WriteToTFRecord(str(output / "data" / "transformed"), file_name_suffix=".tfrecord")
        )
        _ = transform_fn | "WriteTransformFn" >> tft_beam.WriteTransformFn(str(output / "transform"))


class _EncodeExamples(beam.DoFn):
    """Transformed record batches -> serialized tf.Examples, by tfx-bsl's encoder (made once per worker)."""

    def setup(self) -> None:
        self._encoder = None

    def process(self, element, metadata):
        from tfx_bsl.coders.example_coder import RecordBatchToExamplesEncoder

        if self._encoder is None:
            self._encoder = RecordBatchToExamplesEncoder(metadata.schema)
        yield from self._encoder.encode(element[0])


def snapfeed_job(pattern: str, schema_path: str, output: pathlib.Path) -> None:
    from beam_jobs import materialize

    result = materialize.run(
        [
            f"--input={pattern}",
            f"--schema={schema_path}",
            "--tft_preprocessing_fn=bench.tft_bench:preprocessing_fn",
            f"--output={output}",
            "--progress_interval_seconds=0",
        ]
    )
    assert result.state == "written", result


def tfdata_read(output: pathlib.Path, seconds: float) -> dict:
    import tensorflow as tf
    import tensorflow_transform as tft

    spec = tft.TFTransformOutput(str(output / "transform")).transformed_feature_spec()
    files = sorted(str(p) for p in (output / "data").glob("*.tfrecord"))
    dataset = (
        tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
        .shuffle(10_000, seed=0)
        .batch(BATCH)
        .map(lambda records: tf.io.parse_example(records, spec), num_parallel_calls=tf.data.AUTOTUNE)
        .repeat()
        .prefetch(tf.data.AUTOTUNE)
    )
    return _measure(iter(dataset), seconds, lambda batch: int(batch["id"].shape[0]))


def snapfeed_read(output: pathlib.Path, seconds: float) -> dict:
    import reader

    (snapshot,) = [p for p in output.iterdir() if p.is_dir()]
    dataset = reader.distributed_dataset(str(snapshot), BATCH, num_epochs=None, seed=0)
    return _measure(iter(dataset), seconds, lambda batch: len(batch["id"]))


def _measure(batches, seconds: float, rows_of) -> dict:
    started = time.perf_counter()
    first = next(batches)
    first_batch_s = time.perf_counter() - started
    del first
    rows, cpu, began = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - began < seconds:
        rows += rows_of(next(batches))
    elapsed = time.perf_counter() - began
    return {"rows_per_s": rows / elapsed, "first_batch_s": first_batch_s, "cpu_s": time.process_time() - cpu}


def _in_process(role: str, *args: str) -> dict:
    """One job or reader in a process of its own (its own imports, memory and threads); its JSON result."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    started = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-m", "bench.tft_bench", f"--role={role}", *args], capture_output=True, text=True, env=env
    )
    if completed.returncode != 0:
        raise SystemExit(f"{role} failed:\n{completed.stderr[-3000:]}")
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - started
    return result


def run_role(role: str, pattern: str, schema: str, output: pathlib.Path, seconds: float) -> dict:
    if role in ("tfx-job", "snapfeed-job"):
        started = time.perf_counter()
        (tfx_job if role == "tfx-job" else snapfeed_job)(pattern, schema, output)
        return {"job_s": time.perf_counter() - started}
    return tfdata_read(output, seconds) if role == "tfx-read" else snapfeed_read(output, seconds)


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2, help="job runs per system, interleaved; the median")
    parser.add_argument("--read-seconds", type=float, default=10.0)
    parser.add_argument("--workdir", default=None, help="default: a temp dir, removed afterwards")
    parser.add_argument("--json", default="bench/results/tft.json")
    parser.add_argument("--role", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--pattern", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--output", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.role:
        schema = str(pathlib.Path(args.pattern).parent / "schema.pbtxt")
        print(json.dumps(run_role(args.role, args.pattern, schema, pathlib.Path(args.output), args.read_seconds)))
        return None
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="snapfeed-tft-bench-"))
    try:
        started = time.perf_counter()
        pattern = make_input(workdir / "raw", args.rows, args.files)
        print(f"raw input: {args.rows} tf.Examples in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        jobs: dict[str, list[float]] = {"tfx": [], "snapfeed": []}
        for repeat in range(args.repeats):
            for system in ("tfx", "snapfeed") if repeat % 2 == 0 else ("snapfeed", "tfx"):
                output = workdir / f"{system}-{repeat}"
                shutil.rmtree(output, ignore_errors=True)
                result = _in_process(f"{system}-job", f"--pattern={pattern}", f"--output={output}")
                jobs[system].append(result["job_s"])
                print(f"{system} job {repeat}: {result['job_s']:.1f} s", file=sys.stderr)
        reads = {
            system: _in_process(
                f"{system}-read",
                f"--pattern={pattern}",
                f"--output={workdir / f'{system}-0'}",
                f"--read-seconds={args.read_seconds}",
            )
            for system in ("tfx", "snapfeed")
        }
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    job_s = {system: statistics.median(times) for system, times in jobs.items()}
    figures = {
        "rows": args.rows,
        "job_s": job_s,
        "job_runs_s": jobs,
        "job_ratio_snapfeed_over_tfx": job_s["snapfeed"] / job_s["tfx"],
        "read_rows_per_s": {system: r["rows_per_s"] for system, r in reads.items()},
        "read_ratio_snapfeed_over_tfdata": reads["snapfeed"]["rows_per_s"] / reads["tfx"]["rows_per_s"],
        "first_batch_s": {system: r["first_batch_s"] for system, r in reads.items()},
    }
    print(f"tf.Transform, {args.rows} rows, the same function and raw TFRecords; DirectRunner (in_memory)")
    print(f"{'system':10} {'job s':>8} {'job rows/s':>11} {'read rows/s':>12} {'1st batch':>9}")
    for system, label in (("tfx", "TFX"), ("snapfeed", "snapfeed")):
        read = reads[system]
        print(
            f"{label:10} {job_s[system]:8.1f} {args.rows / job_s[system]:11.0f} {read['rows_per_s']:12.0f} "
            f"{read['first_batch_s']:8.3f}s"
        )
    print(
        f"snapfeed / TFX: job time {figures['job_ratio_snapfeed_over_tfx']:.2f}x (target <= 1.1x), "
        f"read {figures['read_ratio_snapfeed_over_tfdata']:.1f}x tf.data (target >= 20x)"
    )
    out = pathlib.Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    main()
