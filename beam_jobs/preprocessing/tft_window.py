"""tf.Transform over a view's window (``--tft_preprocessing_fn`` with ``--view``): per-day analyzer caches.

A daily job with a view trains on the last N days, and a full-pass analyzer
(a z-score's mean, a vocabulary) must cover all N of them. Analyzing the whole
window from raw every day would read N days of input to add one. Instead, as
TFX's Transform does with its analyzer cache, each day's run analyzes only its
own raw input, with tf.Transform's ``AnalyzeDatasetWithCache`` under a dataset
key of its own (the snapshot id and run), and commits that analysis cache in
the run (``<run_id>/tft_cache/<key>/``), beside the day's own graph; the
snapshot's rows are the raw features the function reads, untransformed.

When the day is added to the view, ``window_graph`` computes the graph of the
version being made from the caches of every day it lists: each day is a
dataset key whose cache is complete, so tf.Transform reads no raw input at all
and merges the cached accumulators (sums and counts, quantile summaries,
vocabulary counts), giving what analyzing all the days' raw rows at once would.
The graph is written under ``VIEW/graphs/`` before the version that names it,
so a version never names a graph that is not all there. Readers apply it to
the raw rows at read time (``reader.transform_output("VIEW@K")``,
``transform_features``): old days' rows never need transforming again when the
window moves.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Callable

import apache_beam as beam
import google_crc32c
import pyarrow as pa
from google.protobuf import text_format

from beam_jobs.inputs.sources import densify, fixed_shapes
from beam_jobs.preprocessing import raw_features, transform_graph
from beam_jobs.preprocessing.tf_transform import FLAG, AnalyzeAndTransform
from schemas import paths, storage
from schemas.errors import UsageError
from schemas.snapshot_pb2 import RunFile
from schemas.tft_import import import_tft

#: What ``transform_library`` records for a window run: its rows are raw and its run holds an analyzer cache,
#: so it is another snapshot than the same function's transformed rows (the fingerprint says so).
WINDOW_MODE = "raw rows + analyzer cache for a --view window graph"
#: In the run's cache folder: what the day's analysis read (rows and Arrow bytes counted in the pipeline).
ANALYSIS_RECORD = "analysis.json"
#: The folder of a view holding the window graphs its versions name.
GRAPHS = "graphs"
METRICS_NAMESPACE = "snapfeed"
_KEY_CHARS = re.compile(r"[^a-zA-Z0-9.\-_]")


def dataset_key(snapshot_id: str, run_id: str) -> str:
    """The tf.Transform dataset key of one snapshot run (letters, digits, ``.-_``, as tf.Transform allows)."""
    return _KEY_CHARS.sub("_", f"{snapshot_id}.{run_id}")


def cache_dir(run_dir: str) -> str:
    return paths.join(run_dir, paths.TFT_CACHE)


class _Count(beam.DoFn):
    """(rows, Arrow bytes) of each batch the analyzers get; Beam counters ``snapfeed:tft_analyzed_*`` too."""

    def setup(self):
        from apache_beam.metrics import Metrics

        self._rows = Metrics.counter(METRICS_NAMESPACE, "tft_analyzed_rows")
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "tft_analyzed_bytes")

    def process(self, batch: pa.RecordBatch):
        self._rows.inc(batch.num_rows)
        self._bytes.inc(batch.nbytes)
        yield batch.num_rows, batch.nbytes


def _sum_pairs(pairs) -> tuple[int, int]:
    rows = nbytes = 0
    for r, b in pairs:
        rows += r
        nbytes += b
    return rows, nbytes


def _walk_local(source: str) -> list[tuple[str, bytes]]:
    """(path below ``source``, bytes) of every file under ``source`` (tf.io.gfile: what tf.Transform wrote)."""
    import tensorflow as tf

    found = []
    for directory, _, names in tf.io.gfile.walk(source):
        relative = directory[len(source) :].strip("/")
        for name in sorted(names):
            with tf.io.gfile.GFile(f"{directory}/{name}", "rb") as stream:
                found.append(("/".join(part for part in (*relative.split("/"), name) if part), stream.read()))
    return found


def publish_day(
    _,
    run_dir: str,
    snapshot: paths.SnapshotPaths,
    raw_schema_text: str,
    transform_fn_dir: str,
    metadata_dir: str,
    cache_temp: str,
    key: str,
    counts: tuple[int, int],
    raw_input_bytes: int,
    cache_written: list,
) -> list[RunFile]:
    """The day's graph (``transform_graph.publish``) and its analyzer cache, with what the analysis read, copied
    into the run; every file as a ``RunFile`` for the manifest. ``cache_written`` only orders this after the cache
    is written."""
    del cache_written
    listed = transform_graph.publish(
        None,
        run_dir=run_dir,
        snapshot=snapshot,
        raw_schema_text=raw_schema_text,
        transform_fn_dir=transform_fn_dir,
        metadata_dir=metadata_dir,
    )
    rows, nbytes = counts
    record = {"dataset_key": key, "rows": rows, "arrow_bytes": nbytes, "raw_input_bytes": raw_input_bytes}
    files = [(paths.join(cache_dir(run_dir), relative), data) for relative, data in _walk_local(cache_temp)]
    files.append((paths.join(cache_dir(run_dir), ANALYSIS_RECORD), json.dumps(record, sort_keys=True).encode()))
    for path, data in files:
        storage.atomic_write(path, data)
        listed.append(RunFile(path=snapshot.relative(path), num_bytes=len(data), crc32c=google_crc32c.value(data)))
    return sorted(listed, key=lambda f: f.path)


class AnalyzeDay(AnalyzeAndTransform):
    """Raw batches in TFXIO's form -> (the raw rows, dense, for the shards; the run's graph and cache files): the
    same inputs and constructor as ``AnalyzeAndTransform``, another analysis.

    The day's own analysis, under its dataset key, writes the cache a view's window graph merges; the rows stay
    raw, for the window's graph to be applied at read time.
    """

    def expand(self, raw):
        import_tft(FLAG)
        import tensorflow_transform.beam as tft_beam
        from tensorflow_transform.beam import analyzer_cache
        from tensorflow_transform.beam.tft_beam_io import beam_metadata_io

        key = dataset_key(self._run.snapshot_id, self._run.run_id)
        cache_temp = os.path.join(self._temp_dir, paths.TFT_CACHE)
        config = raw_features.tensor_adapter_config(self._schema)
        counts = (
            raw
            | "CountAnalyzed" >> beam.ParDo(_Count())
            | "SumAnalyzed" >> beam.CombineGlobally(_sum_pairs).without_defaults()
        )
        with tft_beam.Context(temp_dir=self._temp_dir):
            transform_fn, cache = (
                {analyzer_cache.DatasetKey(key): raw},
                {},
                config,
            ) | "AnalyzeDatasetWithCache" >> tft_beam.AnalyzeDatasetWithCache(self._fn)
            written = cache | "WriteAnalysisCache" >> analyzer_cache.WriteAnalysisCacheToFS(raw.pipeline, cache_temp)
            saved_model_dir, transform_metadata = transform_fn
            metadata_dir = transform_metadata | "WriteMetadataToTemp" >> beam_metadata_io.WriteMetadata(
                os.path.join(self._temp_dir, "transformed_metadata"), raw.pipeline, write_to_unique_subdirectory=True
            )
        cache_done = tuple(written) | "CacheWritten" >> beam.Flatten() if written else None
        rows = raw | "RawColumns" >> beam.Map(densify, fixed_shapes(self._schema))
        files = (
            raw.pipeline
            | "CreatePublishStep" >> beam.Create([None])
            | "PublishGraphAndCache"
            >> beam.FlatMap(
                publish_day,
                run_dir=self._run.paths.run_dir(self._run.run_id),
                snapshot=self._run.paths,
                raw_schema_text=text_format.MessageToString(self._schema),
                transform_fn_dir=beam.pvalue.AsSingleton(saved_model_dir),
                metadata_dir=beam.pvalue.AsSingleton(metadata_dir),
                cache_temp=cache_temp,
                key=key,
                counts=beam.pvalue.AsSingleton(counts, default_value=(0, 0)),
                raw_input_bytes=self._run.raw_input_bytes,
                cache_written=beam.pvalue.AsList(cache_done) if cache_done is not None else [],
            )
        )
        return rows, files


def read_analysis_record(member_run_dir: str) -> dict | None:
    """What a day's analysis read (``ANALYSIS_RECORD``), or None for a run without an analyzer cache."""
    try:
        return json.loads(storage.read_bytes(paths.join(cache_dir(member_run_dir), ANALYSIS_RECORD)))
    except FileNotFoundError:
        return None


def _cache_entry_keys(member_cache: str) -> list:
    """The analyzer cache entries a day's cache holds (its ``MANIFEST``, read by tf.Transform's own reader)."""
    from tensorflow_transform.beam import analyzer_cache

    return list(analyzer_cache._ManifestFile(member_cache).read())  # noqa: SLF001 - tf.Transform's file format


def _copy_tree(source: str, local: str) -> None:
    """Every file under ``source`` (local or a bucket) copied below the local folder ``local``."""
    os.makedirs(local, exist_ok=True)
    for entry in storage.list_dir(source):
        target = os.path.join(local, entry.name)
        if entry.is_dir:
            _copy_tree(entry.path, target)
        else:
            with open(target, "wb") as out:
                out.write(storage.read_bytes(entry.path))


def window_graph(
    fn: Callable,
    spec: str,
    raw_schema,
    view: str,
    number: int,
    members,
    temp_parent: str | None = None,
) -> dict:
    """The graph of version ``number`` of ``view``: ``fn``'s analyzers over every member's cache, written under
    ``VIEW/graphs/``. Returns what the version records: the graph's folder (relative to the view), its files with
    size and CRC32C, and what the analysis read (raw rows: none; each day's cache bytes).

    Runs a small Beam pipeline in the driver (DirectRunner): it merges accumulators, a few KB a day.
    """
    import_tft(FLAG)
    import tensorflow_transform.beam as tft_beam
    from tensorflow_transform.beam import analysis_graph_builder, analyzer_cache

    days = []
    for member in members:
        run_dir = paths.join(member.directory, member.run_id)
        record = read_analysis_record(run_dir)
        if record is None:
            raise UsageError(
                f"{member.directory} (run {member.run_id}) has no tf.Transform analyzer cache: it was not "
                f"materialized with {FLAG} and --view, so the window graph of {view} cannot cover it without "
                f"reading its raw input; materialize that day again with {FLAG}={spec} --view={view}"
            )
        key = analyzer_cache.DatasetKey(record["dataset_key"])
        days.append((member, key, paths.join(cache_dir(run_dir), key.key), record))

    specs = raw_features.tensor_adapter_config(raw_schema)
    from tfx_bsl.tfxio.tensor_adapter import TensorAdapter

    type_specs = TensorAdapter(specs).OriginalTypeSpecs()
    temp = tempfile.mkdtemp(prefix="snapfeed-tft-window-", dir=temp_parent)
    try:
        # tf.Transform reads caches through TensorFlow's filesystems, which have no s3://: each day's (a few KB)
        # is copied to local disk first, through Beam's FileSystems like every other file of a run.
        caches = os.path.join(temp, "caches")
        for _, key, member_cache, _ in days:
            _copy_tree(member_cache, os.path.join(caches, key.key))
        stand_in = {
            key: analyzer_cache.DatasetCache(
                dict.fromkeys(_cache_entry_keys(os.path.join(caches, key.key)), True), None
            )
            for _, key, _, _ in days
        }
        needed = analysis_graph_builder.get_analysis_dataset_keys(fn, type_specs, list(stand_in), stand_in, False)
        if needed:
            lacking = [member.directory for member, key, *_ in days if key in needed]
            raise UsageError(
                f"the analyzer caches of {', '.join(lacking)} lack analyzers {FLAG}={spec} has (they were "
                f"materialized with another function): the window graph of {view} would need their raw input; "
                f"materialize them again with this function"
            )
        output = os.path.join(temp, "graph")
        options = beam.options.pipeline_options.PipelineOptions(runner="DirectRunner")
        with beam.Pipeline(options=options) as pipeline, tft_beam.Context(temp_dir=os.path.join(temp, "tft")):
            cache = {}
            for index, (_, key, _, _) in enumerate(days):
                cache.update(pipeline | f"ReadCache{index}" >> analyzer_cache.ReadAnalysisCacheFromFS(caches, [key]))
            transform_fn, _ = (
                dict.fromkeys((key for _, key, *_ in days), None),
                cache,
                specs,
            ) | "AnalyzeWindow" >> tft_beam.AnalyzeDatasetWithCache(fn, pipeline=pipeline)
            _ = transform_fn | "WriteWindowGraph" >> tft_beam.WriteTransformFn(output)
        raw_metadata_name = paths.TRANSFORM_DIRS[2]
        files = dict(_walk_local(output))
        files[f"{raw_metadata_name}/schema.pbtxt"] = text_format.MessageToString(raw_schema).encode()
        summary = transform_graph.summarize(files)
        files[paths.TRANSFORM_SUMMARY] = json.dumps(summary, indent=1, sort_keys=True).encode()
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    directory = f"{GRAPHS}/{number:08d}-{uuid.uuid4().hex[:8]}"  # a lost race's graph is never overwritten
    listed = []
    for relative, data in sorted(files.items()):
        storage.atomic_write(paths.join(view, *directory.split("/"), *relative.split("/")), data)
        listed.append({"path": relative, "num_bytes": len(data), "crc32c": google_crc32c.value(data)})
    return {
        "directory": directory,
        "files": listed,
        "analyzers": summary["analyzers"],
        "analyzed": {
            "raw_rows": 0,  # every day's dataset key is cached: no raw input is fed to this analysis
            "days": [
                {
                    "directory": member.directory,
                    "run_id": member.run_id,
                    "dataset_key": key.key,
                    "cache_bytes": _tree_bytes(member_cache),
                    "rows_when_materialized": record["rows"],
                }
                for member, key, member_cache, record in days
            ],
        },
    }


def _tree_bytes(directory: str) -> int:
    entries = storage.list_dir(directory)
    return sum(_tree_bytes(entry.path) if entry.is_dir else entry.size for entry in entries)


def describe(version, analysis: dict | None) -> str:
    """One line: what the run's analysis read from raw input, and the window graph the version names."""
    graph = version.transform_graph
    days = graph["analyzed"]["days"]
    own = (
        f"analyzed {analysis['rows']} raw rows ({analysis['raw_input_bytes']} bytes of input) of this run"
        if analysis
        else "analyzed no raw rows in this run"
    )
    cached = sum(day["cache_bytes"] for day in days)
    return (
        f"tf.Transform window: {own}; {version.view}@{version.number}'s graph {graph['directory']} merges the "
        f"analyzer caches of {len(days)} snapshots ({cached} bytes), {sum(d['rows_when_materialized'] for d in days)} "
        f"rows"
    )
