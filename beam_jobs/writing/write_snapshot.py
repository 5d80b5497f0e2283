"""``WriteSnapshot``: the composite PTransform that ends any pipeline of RecordBatches.

Begin -> WriteShards -> CollectShards -> Finalize. Shards appear under
``<run_id>/`` only when closed (``schemas.storage.open_output``); each closed shard is
reported downstream as data, so shards left by retried bundles are not in the
finalize list and are deleted there (docs/architecture.md §2.3).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
import uuid

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_jobs.runners import direct_runner
from beam_jobs.writing import commit
from beam_jobs.writing.commit import RunSpec, WrittenShard
from schemas import columns, metadata, paths, storage
from schemas.errors import UsageError
from schemas.shard_codec import (
    AUTO_BLOCK_BYTES,
    AUTO_SHARD_BYTES,
    BlockAccumulator,
    Compression,
    ShardWriter,
    block_bytes_within,
)
from schemas.state_machine import Mode, decide

METRICS_NAMESPACE = "snapfeed"


class _OpenShard:
    """A shard being written; it appears under its final name only when committed.

    The store decides how (``schemas.storage.open_output``): a temp name renamed
    into place on local disk, one streamed upload completed on close on object
    stores, where a rename would copy every byte again.
    """

    def __init__(self, final_path: str, first_block: pa.RecordBatch, compression: Compression, writes) -> None:
        """``writes``: the single-thread executor the shard's bytes are written on (``ShardWriter``)."""
        self.final_path = final_path
        self.handle = storage.open_output(final_path)
        self.compression = compression.for_shard(first_block)
        self.writer = ShardWriter(self.handle, first_block.schema, self.compression, writes=writes)
        self.schema = first_block.schema

    def commit(self) -> WrittenShard:
        stats = self.writer.close()
        self.handle.close()
        return WrittenShard(
            path=self.final_path,
            stats=stats,
            schema_ipc=self.schema.serialize().to_pybytes(),
            compression=self.compression.value,
        )


class _WriteShardsFn(beam.DoFn):
    """Writes the RecordBatches of a bundle into size-bounded shards.

    A shard closed at the size bound is reported from ``process`` (a main
    output every runner keeps); the bundle's last, partly filled shard can only
    be closed in ``finish_bundle``, whose output Beam 2.77's DaskRunner drops
    (``beam_jobs.runners.dask_runner`` carries the fix; finalize's row check fails a
    runner that still loses it).

    The bundle's thread encodes blocks; their bytes are checksummed and written
    on a thread of its own (``ShardWriter(writes=)``), and a full shard is closed
    (its footer written, then fsynced and renamed into place, or its upload
    completed) on a third while the next one is written: at 1,000,000 rows of
    3 KB the fsyncs took 5 s and the writes 4 s of a 25 s job when the bundle
    waited for them. A shard is reported once its close is done, in order; at
    most ``CLOSES_IN_FLIGHT`` wait, and ``finish_bundle`` waits for all, so a
    bundle never ends with a shard not in place.
    """

    #: Shards being closed at once before writing waits for the oldest (bounds the page cache left to flush).
    CLOSES_IN_FLIGHT = 2

    def __init__(self, run: RunSpec, compression: Compression, shard_size_bytes: int, block_size_bytes: int) -> None:
        self._run = run
        self._compression = compression
        self._shard_size_bytes = shard_size_bytes
        self._block_size_bytes = block_size_bytes
        self._rows = Metrics.counter(METRICS_NAMESPACE, "rows")
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes")
        self._shards = Metrics.counter(METRICS_NAMESPACE, "shards")

    def setup(self) -> None:
        self._writes = concurrent.futures.ThreadPoolExecutor(1, "snapfeed-shard-write")
        self._closer = concurrent.futures.ThreadPoolExecutor(1, "snapfeed-shard-close")

    def teardown(self) -> None:
        self._closer.shutdown(wait=True)
        self._writes.shutdown(wait=True)

    def start_bundle(self) -> None:
        self._token = uuid.uuid4().hex[:12]
        self._next_index = 0
        self._schema: pa.Schema | None = None
        self._accumulator: BlockAccumulator | None = None  # sized for the shard bound once the schema is known
        self._open: _OpenShard | None = None
        self._closing: collections.deque[concurrent.futures.Future] = collections.deque()

    def process(self, batch: pa.RecordBatch):
        if not isinstance(batch, pa.RecordBatch):
            raise TypeError(f"WriteSnapshot expects pyarrow.RecordBatch elements, got {type(batch).__name__}")
        self._schema = columns.check_same_schema(self._schema, batch.schema, "the pipeline feeding WriteSnapshot")
        # What every reader output can read, or a refusal naming the column (schemas.columns).
        batch = columns.stored_batch(batch)
        if self._accumulator is None:
            block_bytes = block_bytes_within(self._shard_size_bytes, self._block_size_bytes, batch.schema)
            self._accumulator = BlockAccumulator(block_bytes)
        for block in self._accumulator.add(batch):
            self._write(block)
        yield from self._closed(wait_for=len(self._closing) - self.CLOSES_IN_FLIGHT)

    def _write(self, block: pa.RecordBatch) -> None:
        """Writes ``block``, into a new shard when it would take the open one past the size bound."""
        if self._open is not None and not self._open.writer.fits(block, self._shard_size_bytes):
            self._start_close()
        if self._open is None:
            name = paths.shard_name(self._token, self._next_index)
            self._next_index += 1
            path = self._run.paths.shard(self._run.run_id, name)
            self._open = _OpenShard(path, block, self._compression, self._writes)
        self._open.writer.write_block(block)

    def _start_close(self) -> None:
        shard, self._open = self._open, None
        self._closing.append(self._closer.submit(shard.commit))

    def _closed(self, wait_for: int = 0) -> list[WrittenShard]:
        """The shards whose close is done, oldest first, after waiting for the ``wait_for`` oldest."""
        done = []
        while self._closing and (wait_for > 0 or self._closing[0].done()):
            shard = self._closing.popleft().result()  # a failed close raises here, in the bundle
            wait_for -= 1
            self._rows.inc(shard.stats.num_rows)
            self._bytes.inc(shard.stats.num_bytes)
            self._shards.inc()
            done.append(shard)
        return done

    def finish_bundle(self):
        for block in self._accumulator.flush() if self._accumulator is not None else ():
            self._write(block)
        if self._open is not None:
            self._start_close()
        for shard in self._closed(wait_for=len(self._closing)):
            yield WindowedValue(shard, MIN_TIMESTAMP, [GlobalWindow()])


def _begin(run: RunSpec, *, write_marker: bool) -> RunSpec:
    """Writes the pending marker of a standalone run; the CLI has written its own."""
    if not write_marker:
        return run
    run = _as_forced_write(run)
    commit.begin_run(run)
    return run


def _as_forced_write(run: RunSpec) -> RunSpec:
    """The run as ``--mode=write`` would start it: superseding the finalized run found now, if any.

    Decided when the pipeline runs, not when it is built, since the snapshot
    may be finalized in between. Without it the new run could never replace
    metadata.final and would lose to the very run it was meant to replace.
    """
    decision = decide(
        mode=Mode.WRITE,
        pending=metadata.read_pending(run.paths),
        manifest=metadata.read_manifest(run.paths),
        now=time.time(),
        expiry_seconds=0,
    )
    return dataclasses.replace(run, supersedes_run_id=decision.supersedes_run_id)


def num_rows(batch: pa.RecordBatch) -> int:
    return batch.num_rows


def count_rows(batches, label: str):
    """The total rows of a PCollection of RecordBatches, as a one-element PCollection (0 when empty).

    A main output that every runner keeps, unlike counters (best effort on some
    runners) or ``finish_bundle`` output (dropped by Beam's DaskRunner).
    """
    return batches | f"{label}Rows" >> beam.Map(num_rows) | f"{label}Total" >> beam.CombineGlobally(sum)


def _finalize(
    shards: list[WrittenShard],
    run: RunSpec,
    compression: Compression,
    delivered: int,
    read: int | None,
    allow_empty: bool,
    run_files: list | None = None,
) -> commit.FinalizeOutcome:
    counts = commit.RowCounts(delivered=delivered, read=read)
    return commit.finalize(
        run,
        list(shards),
        compression=compression.value,
        counts=counts,
        allow_empty=allow_empty,
        run_files=list(run_files or ()),
    )


class WriteSnapshot(beam.PTransform):
    """Writes a PCollection of ``pyarrow.RecordBatch`` as a finalized snapshot under ``root``.

    Standalone use (``WriteSnapshot(root, snapshot_name="daily")``) begins a new
    run when the pipeline runs, like ``--mode=write``: if ``daily`` is already
    finalized, the new run supersedes it, so a pipeline that rewrites its named
    snapshot replaces it each time (metadata.final is swapped at commit; the old
    run's files stay for readers that opened it, until gc). If another writer
    begins after this one, it owns the snapshot and this run loses the race.
    The materialize CLI passes ``run=`` after deciding with the state machine
    and writing the pending marker itself. The output is one
    ``FinalizeOutcome``: ``committed`` is False, with the winner in ``reason``,
    when another writer won.

    Finalize checks that every row that reached the shard writers is in a
    reported shard, and refuses to commit zero rows (``EmptySnapshotError``)
    unless ``allow_empty``. ``rows_read`` (a one-element PCollection, see
    ``count_rows``) counts the pipeline's input rows, so that error can tell
    empty inputs from a function that dropped every row. ``run_files`` (a
    PCollection of ``RunFile``s: the run's tf.Transform graph, written into the
    run directory before) are listed in the manifest and committed with the
    shards; finalize waits for them.

    Args:
        root: the snapshot root (local, ``gs://``, ``s3://``); with ``run=``, the run's own.
        snapshot_name: the snapshot's name and directory under ``root``, for standalone use.
        run: the run the materialize job began (its pending marker written); None: begin one here.
        compression: the shards' codec, ``"AUTO"``, ``"NONE"``, ``"LZ4"`` or ``"ZSTD"`` (docs/materialize.md).
        shard_size_bytes: shards are cut at about this size.
        block_size_bytes: rows of a shard are grouped in blocks (record batches) of about this size.
        allow_empty: commit a snapshot of zero rows instead of refusing it.
        rows_read: a one-element PCollection of the pipeline's input rows (``count_rows``), for the empty-output error.
        run_files: a PCollection of ``RunFile``s to list in the manifest and commit with the shards.
    """

    def __init__(
        self,
        root: str | None = None,
        *,
        snapshot_name: str | None = None,
        run: RunSpec | None = None,
        compression: str | Compression = "AUTO",
        shard_size_bytes: int = AUTO_SHARD_BYTES,
        block_size_bytes: int = AUTO_BLOCK_BYTES,
        allow_empty: bool = False,
        rows_read=None,
        run_files=None,
    ) -> None:
        super().__init__()
        if run is None:
            if not root or not snapshot_name or not paths.is_valid_snapshot_id(snapshot_name):
                raise UsageError("WriteSnapshot needs a root and a valid snapshot_name (or a RunSpec via run=)")
            root = paths.absolute(root)  # workers do not share the driver's working directory
            storage.check_output_root(root)  # unreachable, unauthorized or read-only: fail before any work
            run = RunSpec(root=root, snapshot_id=snapshot_name, run_id=commit.new_run_id(), snapshot_name=snapshot_name)
            self._write_marker = True
        else:
            self._write_marker = False
        if shard_size_bytes < 1 or block_size_bytes < 1:
            raise UsageError("shard_size_bytes and block_size_bytes must be positive")
        self._run = run
        self._compression = compression if isinstance(compression, Compression) else Compression.parse(compression)
        self._shard_size_bytes = shard_size_bytes
        self._block_size_bytes = block_size_bytes
        self._allow_empty = allow_empty
        self._rows_read = rows_read
        self._run_files = run_files

    @property
    def run(self) -> RunSpec:
        """The run as built (its run id is final; which run it supersedes is found when it begins)."""
        return self._run

    def expand(self, batches):
        # Any pipeline that writes a snapshot may run on the DirectRunner's multi_threading mode, whose
        # periodic data flush corrupts elements between stages (beam_jobs/runners/direct_runner.py): turn it off
        # here, at construction, before the pipeline starts its workers.
        direct_runner.disable_periodic_data_flush()
        # The run is fixed at construction, so WriteShards takes no side input and
        # fuses with the steps before it: batches stream into shards instead of
        # being materialized between stages. Only Finalize waits for Begin.
        begun = (
            batches.pipeline
            | "CreateRun" >> beam.Create([self._run])
            | "Begin" >> beam.Map(_begin, write_marker=self._write_marker)
        )
        written = batches | "WriteShards" >> beam.ParDo(
            _WriteShardsFn(self._run, self._compression, self._shard_size_bytes, self._block_size_bytes)
        )
        read = beam.pvalue.AsSingleton(self._rows_read) if self._rows_read is not None else None
        run_files = beam.pvalue.AsList(self._run_files) if self._run_files is not None else None
        return (
            written
            | "CollectShards" >> beam.combiners.ToList()
            | "Finalize"
            >> beam.Map(
                _finalize,
                run=beam.pvalue.AsSingleton(begun),
                compression=self._compression,
                delivered=beam.pvalue.AsSingleton(count_rows(batches, "Delivered")),
                read=read,
                allow_empty=self._allow_empty,
                run_files=run_files,
            )
        )
