"""The commit protocol of docs/architecture.md §2.3, free of Beam so it is tested directly.

begin_run   -> atomically write snapshot.metadata with a fresh run id
finalize    -> re-read snapshot.metadata; if the run id is still ours, commit
               metadata.final with a no-overwrite create (or, for a forced
               write that supersedes a finalized run, a compare-and-swap that
               only succeeds while the marker names that run); otherwise we
               lost the race and delete our run directory
mark_failed -> record why a run failed so the next writer need not wait for expiry
"""

from __future__ import annotations

import dataclasses
import platform
import time
import uuid

import pyarrow as pa

from schemas import columns, manifests, metadata, paths, storage, writer_process
from schemas.errors import EmptySnapshotError, IncompleteRunError
from schemas.paths import SnapshotPaths
from schemas.shard_codec import ShardStats
from schemas.snapshot_pb2 import (
    FingerprintComponents,
    Manifest,
    PendingMarker,
    RunFile,
    RunState,
    ShardInfo,
    WriterInfo,
)


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:16]}"


def writer_info(runner: str = "") -> WriterInfo:
    import apache_beam

    from beam_jobs import __version__

    process = writer_process.current()
    return WriterInfo(
        tool="snapfeed",
        tool_version=__version__,
        hostname=process.hostname,
        pid=process.pid,
        boot_id=process.boot_id,
        pid_namespace=process.pid_namespace,
        process_start_ticks=process.start_ticks,
        runner=runner,
        beam_version=apache_beam.__version__,
        pyarrow_version=pa.__version__,
        python_version=platform.python_version(),
    )


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What a writer run commits to; shipped (pickled) to the Beam workers.

    Args:
        root: the snapshot root.
        snapshot_id: the snapshot's directory under the root (its fingerprint, or its name).
        run_id: this run's id (``new_run_id()``): its files live under ``<snapshot>/<run_id>/``.
        snapshot_name: the user's name for the snapshot ("" for none).
        fingerprint: the fingerprint the job computed ("" for a named, standalone run).
        components: the serialized ``FingerprintComponents`` (``snapfeed explain`` compares them).
        supersedes_run_id: the finalized run this forced write replaces ("" for none).
        raw_input_bytes: the input files' bytes, recorded in the manifest.
    """

    root: str
    snapshot_id: str
    run_id: str
    snapshot_name: str = ""
    fingerprint: str = ""
    components: bytes = b""
    supersedes_run_id: str = ""
    raw_input_bytes: int = 0

    @property
    def paths(self) -> SnapshotPaths:
        return SnapshotPaths(self.root, self.snapshot_id)

    def fingerprint_components(self) -> FingerprintComponents:
        return FingerprintComponents.FromString(self.components)


@dataclasses.dataclass(frozen=True)
class WrittenShard:
    """One closed shard, reported by a writer bundle to the finalize step as data (pickled between Beam steps)."""

    path: str
    stats: ShardStats  # rows, bytes, rows per block and CRC32C, as the shard writer counted them
    schema_ipc: bytes  # the Arrow schema, serialized, to check all shards agree
    compression: str = ""  # the codec this shard was written with ("": the run's)


@dataclasses.dataclass(frozen=True)
class RowCounts:
    """Rows counted as data (main outputs, which every runner keeps) on their way to the shard writers.

    Finalize checks them against the rows of the shards reported to it: a
    runner that loses part of the writers' output must fail the run, never
    commit what happened to arrive (or nothing at all).
    """

    delivered: int  # rows that reached WriteSnapshot
    read: int | None = None  # rows the inputs yielded before preprocessing (None: not counted)


@dataclasses.dataclass(frozen=True)
class FinalizeOutcome:
    committed: bool
    reason: str
    manifest: Manifest | None = None


def begin_run(run: RunSpec, *, runner: str = "", now: float | None = None) -> PendingMarker:
    """Step 1: write (possibly overwriting) snapshot.metadata naming our run."""
    storage.make_dirs(run.paths.directory)
    marker = PendingMarker(
        format_version=metadata.FORMAT_VERSION,
        snapshot_id=run.snapshot_id,
        run_id=run.run_id,
        start_time=time.time() if now is None else now,
        complete=False,
        state=RunState.PENDING,
        supersedes_run_id=run.supersedes_run_id,
        writer=writer_info(runner),
        fingerprint=run.fingerprint,
        fingerprint_components=run.fingerprint_components() if run.components else None,
    )
    storage.atomic_write(run.paths.pending_marker, metadata.to_json(marker))
    return marker


def mark_failed(run: RunSpec, error: str) -> bool:
    """Records a failure in snapshot.metadata if the marker is still ours."""
    pending = metadata.read_pending(run.paths)
    if pending is None or pending.run_id != run.run_id:
        return False
    pending.state = RunState.FAILED
    pending.error = error[:2000]
    pending.failed_time = time.time()
    storage.atomic_write(run.paths.pending_marker, metadata.to_json(pending))
    return True


def _check_one_schema(shards: list[WrittenShard], run: RunSpec) -> pa.Schema | None:
    """The shards' one schema. Batches preprocessed by different workers (threads, processes,
    machines) only meet here, so this is where a function that changes its output is caught."""
    function = run.fingerprint_components().function_name if run.components else ""
    producer = f"preprocessing_fn {function}" if function else "the pipeline feeding WriteSnapshot"
    first = None
    for shard in shards:
        schema = pa.ipc.read_schema(pa.py_buffer(shard.schema_ipc))
        first = columns.check_same_schema(first, schema, producer, f": shards {shards[0].path} and {shard.path} differ")
    return first


def _remove_unlisted_files(run: RunSpec, listed: set[str], directory: str | None = None) -> None:
    """Deletes shards of retried bundles and temp files: only listed files (shards, the tf.Transform graph) survive."""
    for entry in storage.list_dir(directory or run.paths.run_dir(run.run_id), include_temp=True):
        if entry.is_dir:
            _remove_unlisted_files(run, listed, entry.path)
        elif paths.is_temp_name(entry.name) or run.paths.relative(entry.path) not in listed:
            storage.delete_file(entry.path)


def build_manifest(
    run: RunSpec,
    pending: PendingMarker,
    shards: list[WrittenShard],
    compression: str,
    run_files: list[RunFile] = (),
) -> Manifest:
    # An empty run (allowed with allow_empty) has no shard to take a schema from: it gets one without columns.
    schema = _check_one_schema(shards, run) or pa.schema([])
    listed = [
        ShardInfo(
            path=run.paths.relative(s.path),
            num_rows=s.stats.num_rows,
            num_bytes=s.stats.num_bytes,
            block_rows=list(s.stats.block_rows),
            crc32c=s.stats.crc32c,
            block_crc32c=list(s.stats.block_crc32c),
            compression=s.compression,
        )
        for s in sorted(shards, key=lambda s: s.path)
    ]
    manifest = manifests.build(
        schema,
        listed,
        format_version=metadata.FORMAT_VERSION,
        snapshot_id=run.snapshot_id,
        snapshot_name=run.snapshot_name,
        run_id=run.run_id,
        start_time=pending.start_time,
        finalize_time=time.time(),
        complete=True,
        writer=pending.writer,
        fingerprint=run.fingerprint,
        compression=compression,
        supersedes_run_id=pending.supersedes_run_id,
        raw_input_bytes=run.raw_input_bytes,
        transform_files=sorted(run_files, key=lambda f: f.path),
    )
    if run.components:
        manifest.fingerprint_components.CopyFrom(run.fingerprint_components())
    return manifest


def _lose(run: RunSpec, reason: str) -> FinalizeOutcome:
    storage.delete_tree(run.paths.run_dir(run.run_id))
    return FinalizeOutcome(committed=False, reason=reason)


def _after_refused_write(run: RunSpec, reason: str) -> FinalizeOutcome:
    """A conditional create or swap was refused: re-read the marker before concluding we lost.

    On an object store the refusal may answer a retry of our own write whose
    first response was lost (the first attempt did commit). Deleting our run
    then would leave a ``metadata.final`` naming a run with no data, so a
    marker naming our run means we committed.
    """
    winner = metadata.read_manifest(run.paths)
    if winner is not None and winner.run_id == run.run_id:
        return FinalizeOutcome(
            committed=True, reason=f"{reason} (a retried write found its own commit)", manifest=winner
        )
    return _lose(run, f"lost the race: run {winner.run_id if winner else '?'} committed first")


def _own_pending(run: RunSpec) -> tuple[PendingMarker | None, str]:
    """(snapshot.metadata, "") while it names our run, still live, else (None, why we may not commit).

    A run its driver marked failed (interrupted, or given up on) must not
    commit: a remote runner may go on running a job whose driver has gone.
    """
    pending = metadata.read_pending(run.paths)
    if pending is None or pending.run_id != run.run_id:
        return None, f"lost the race: snapshot.metadata now names {pending.run_id if pending else 'nobody'}"
    if pending.state == RunState.FAILED:
        return None, f"run {run.run_id} was marked failed by its driver ({pending.error[:200]})"
    return pending, ""


def _describe_inputs(components: FingerprintComponents) -> str:
    files = components.input_files
    shown = ", ".join(f"{f.path} ({f.size_bytes} bytes)" for f in files[:3])
    more = f" and {len(files) - 3} more" if len(files) > 3 else ""
    return f"{shown}{more}" if files else ", ".join(components.input_patterns) or "the inputs"


def _empty_cause(run: RunSpec, counts: RowCounts) -> str:
    components = run.fingerprint_components() if run.components else FingerprintComponents()
    if counts.read and components.function_name:
        return (
            f"preprocessing_fn {components.function_name} kept none of the {counts.read} rows read "
            f"(it returned no rows, or no columns)."
        )
    if counts.read == 0:
        return f"the input files hold no rows: {_describe_inputs(components)}."
    return "no rows reached WriteSnapshot."


def check_complete(run: RunSpec, shards: list[WrittenShard], counts: RowCounts, *, allow_empty: bool) -> None:
    """Refuses a commit that would lose rows, or that holds none unless ``allow_empty``."""
    listed = sum(shard.stats.num_rows for shard in shards)
    if listed != counts.delivered:
        raise IncompleteRunError(
            f"{counts.delivered} rows reached the shard writers of run {run.run_id}, but the runner reported "
            f"{listed} rows in {len(shards)} closed shards to its finalize step, so nothing was committed to "
            f"{run.paths.directory}. The runner lost output of the shard writers; run the job on another runner "
            f"(the shards written are kept under {run.paths.run_dir(run.run_id)} until snapfeed gc)."
        )
    if listed == 0 and not allow_empty:
        raise EmptySnapshotError(
            f"{run.paths.directory}: {_empty_cause(run, counts)} Nothing was committed; "
            f"pass --allow_empty (WriteSnapshot(allow_empty=True)) to commit an empty snapshot."
        )


def finalize(
    run: RunSpec,
    shards: list[WrittenShard],
    *,
    compression: str,
    counts: RowCounts | None = None,
    allow_empty: bool = False,
    run_files: list[RunFile] = (),
) -> FinalizeOutcome:
    """Steps 3-4: commit metadata.final if we still own the snapshot, else clean up.

    Idempotent: runners may execute the finalize bundle more than once, and a
    repeat must find its own commit rather than "lose" to it. ``counts``
    (always given by WriteSnapshot) are checked against ``shards`` first: a
    run with missing or no rows fails instead of committing. ``run_files``
    (the run's tf.Transform graph) are listed with the shards.
    """
    current = metadata.read_manifest(run.paths)
    if current is not None and current.run_id == run.run_id:
        return FinalizeOutcome(committed=True, reason="already committed", manifest=current)
    pending, refused = _own_pending(run)
    if pending is None:
        return _lose(run, refused)
    listed_rows = sum(shard.stats.num_rows for shard in shards)
    check_complete(run, shards, counts or RowCounts(delivered=listed_rows), allow_empty=allow_empty)
    manifest = build_manifest(run, pending, shards, compression, run_files)
    _remove_unlisted_files(run, {f.path for f in (*manifest.shards, *manifest.transform_files)})
    if pending.supersedes_run_id:
        return _commit_replacing(run, pending.supersedes_run_id, manifest)
    return _commit_first(run, manifest)


def _commit_first(run: RunSpec, manifest: Manifest) -> FinalizeOutcome:
    """Step 3: the no-overwrite create lets at most one writer commit an unfinalized snapshot."""
    if storage.create_exclusive(run.paths.final_marker, metadata.to_json(manifest)):
        return FinalizeOutcome(committed=True, reason="committed", manifest=manifest)
    return _after_refused_write(run, "committed")


def _commit_replacing(run: RunSpec, superseded: str, manifest: Manifest) -> FinalizeOutcome:
    """Step 4: swap metadata.final from the run we supersede to ours, or lose.

    Everything read earlier in finalize may be stale by now (building the
    manifest takes a while), so the conditions are checked again here: the
    marker must still name ``superseded`` (else another forced writer replaced
    it first) and snapshot.metadata must still name us (else a later writer
    owns the snapshot, as in step 3). Those two reads are not one atomic step
    with the swap; the compare-and-swap on the marker's bytes is, so whatever
    happens between them at most one writer replaces a given finalized run. The
    old run's files stay for readers that opened it, until gc.
    """
    pending, refused = _own_pending(run)
    if pending is None:
        return _lose(run, refused)
    try:
        expected = storage.read_bytes(run.paths.final_marker)
    except FileNotFoundError:
        return _commit_first(run, manifest)  # nothing left to replace: commit like a first writer
    current = metadata.from_json(expected, Manifest, run.paths.final_marker)
    if current.run_id != superseded:
        return _lose(run, f"lost the race: run {current.run_id} committed first (it replaced {superseded})")
    if storage.compare_and_swap(run.paths.final_marker, expected, metadata.to_json(manifest)):
        return FinalizeOutcome(committed=True, reason=f"replaced run {superseded}", manifest=manifest)
    return _after_refused_write(run, f"replaced run {superseded}")
