"""Finding and opening one snapshot: the reader's side of the state machine.

``open_snapshot`` accepts a snapshot root (the job's ``--output``) or a
``<root>/<snapshot_id>`` directory. Only finalized snapshots are read unless
``mode="read"``, which reads what a pending run has committed so far (with a
warning), as the RFC's READ override does.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import time
import warnings
from collections.abc import Callable, Sequence

import google_crc32c
import numpy as np
import pyarrow as pa

from reader.core import block_io
from schemas import columns, manifests, metadata, paths, shard_codec, state_machine, storage, writer_process
from schemas.errors import (
    CorruptSnapshotError,
    SchemaMismatchError,
    SnapshotInProgressError,
    SnapshotNotFoundError,
    StorageError,
    UsageError,
)
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import ColumnSpec, Manifest, PendingMarker, RunFile, ShardInfo
from schemas.state_machine import describe_pending, format_time

READ_MODES = ("auto", "read")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A column as batches carry it: ``shape`` starts with the batch dimension (None).

    A variable-length list column has shape ``(None, None)`` and the dtype of
    its values; its batches are object arrays of one 1-D array per row.
    """

    name: str
    shape: tuple[int | None, ...]
    dtype: np.dtype | str  # a NumPy dtype, or "binary" / "string" (object arrays)

    @property
    def ragged(self) -> bool:
        return None in self.shape[1:]

    @property
    def fixed_width(self) -> bool:
        """Every row is the same number of bytes of one NumPy dtype (no strings, no lists)."""
        return not self.ragged and not isinstance(self.dtype, str)

    def empty(self, rows: int) -> np.ndarray:
        """An uninitialized batch array: ``[rows, *shape]`` of the dtype, or an object array of ``rows`` values
        for strings, bytes and lists.

        Args:
            rows: the batch's rows.
        """
        if self.fixed_width:
            return np.empty((rows, *self.shape[1:]), dtype=self.dtype)
        return np.empty(rows, dtype=object)


def _tensor_spec(column: ColumnSpec, schema: pa.Schema) -> TensorSpec:
    shape = (None, *(None if size == columns.VARIABLE else size for size in column.shape))
    if column.dtype in ("binary", "string"):
        return TensorSpec(column.name, shape, column.dtype)
    try:
        return TensorSpec(column.name, shape, np.dtype(column.dtype))
    except TypeError:
        raise SchemaMismatchError(
            f"column {column.name!r} has Arrow type {schema.field(column.name).type}, which the reader cannot "
            f"represent; materialize the snapshot again (the job now refuses such a column and says what to do)"
        ) from None


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One readable snapshot: its manifest and where it lives."""

    paths: SnapshotPaths
    metadata: Manifest
    finalized: bool = True

    @property
    def path(self) -> str:
        return self.paths.directory

    @property
    def snapshot_id(self) -> str:
        return self.paths.snapshot_id

    @property
    def num_rows(self) -> int:
        return self.metadata.num_rows

    @property
    def num_shards(self) -> int:
        return len(self.metadata.shards)

    @property
    def schema(self) -> pa.Schema:
        return manifests.arrow_schema(self.metadata)

    @functools.cached_property
    def element_spec(self) -> dict[str, TensorSpec]:
        """Derived from the stored Arrow schema (by ``schemas.columns``, as the job derives the manifest's
        column specs), so snapshots written before a type was readable are read the current way."""
        schema = self.schema
        return {spec.name: _tensor_spec(spec, schema) for spec in columns.column_specs(schema)}

    @property
    def block_rows(self) -> list[list[int]]:
        return [list(shard.block_rows) for shard in self.metadata.shards]

    @property
    def num_bytes(self) -> int:
        return self.metadata.num_bytes

    @property
    def column_names(self) -> list[str]:
        return [column.name for column in self.metadata.columns]

    @property
    def identity(self) -> list[str]:
        """What a saved state records of the rows it read: the snapshot id and its run (a union records its
        members', ``reader.core.union``)."""
        return [self.snapshot_id, self.metadata.run_id]

    def locate(self, shard: int) -> tuple[Snapshot, int]:
        """The snapshot holding shard ``shard`` and its index there: this one (a union's are its members').

        Args:
            shard: the shard's place in the manifest.
        """
        return self, shard

    def shard_info(self, index: int) -> ShardInfo:
        """The manifest's entry of a shard.

        Args:
            index: the shard's place in the manifest.
        """
        return self.metadata.shards[index]

    def shard_codec(self, index: int) -> str:
        """The codec a shard's blocks were written with.

        Args:
            index: the shard's place in the manifest.
        """
        return self.metadata.shards[index].compression or self.metadata.compression

    def readable_columns(self, wanted: Sequence[str] | None) -> list[str]:
        """The columns to read: ``wanted``, or one line naming those the snapshot lacks.

        Args:
            wanted: column names, or None for every column.
        """
        names = self.column_names
        if wanted is None:
            return names
        if unknown := [name for name in wanted if name not in names]:
            raise UsageError(f"unknown columns {unknown}; {self.path} has {names}")
        return list(wanted)

    def shard_path(self, index: int) -> str:
        """The full path of a shard.

        Args:
            index: the shard's place in the manifest, ``0 .. num_shards - 1``.
        """
        return self.paths.absolute(self.metadata.shards[index].path)

    @property
    def run_dir(self) -> str:
        """The directory of the run the manifest names: its shards, and its tf.Transform graph if it has one."""
        return self.paths.run_dir(self.metadata.run_id)

    @property
    def has_transform_graph(self) -> bool:
        """Whether the run was transformed by a tf.Transform function whose graph it holds (``transform_files``)."""
        return len(self.metadata.transform_files) > 0

    def verify(self, progress: Callable[[int], None] | None = None) -> int:
        """Recomputes the CRC32C and size of every shard and tf.Transform graph file, and the shards' row
        counts; raises naming every bad file. Returns how many files it checked.

        Args:
            progress: called with the bytes of each file checked (for a progress bar), or None.
        """
        reports = verify_shards(self, progress=progress)
        if problems := [report.problem for report in reports if report.problem]:
            raise CorruptSnapshotError(
                f"{len(problems)} of {len(reports)} files of {self.path} are bad:\n  "
                + "\n  ".join(problems)
                + "\nMaterialize the snapshot again with --mode=write."
            )
        return len(reports)


@dataclasses.dataclass(frozen=True)
class ShardReport:
    path: str
    problem: str  # "" when the shard matches the manifest


def verify_shards(
    snapshot: Snapshot, *, sample: float = 1.0, progress: Callable[[int], None] | None = None, seed: int | None = None
) -> list[ShardReport]:
    """Checks every shard (or a random ``sample`` fraction, at least one) against the manifest, and every file
    of the run's tf.Transform graph (small: always all of them)."""
    indices = list(range(snapshot.num_shards))
    if sample < 1.0:
        indices = sorted(random.Random(seed).sample(indices, min(len(indices), max(1, round(sample * len(indices))))))
    reports = []
    for index in indices:
        shard = snapshot.metadata.shards[index]
        path = snapshot.shard_path(index)
        problem = shard_problem(path, shard, checksum=False) or _block_problem(path, shard)
        reports.append(ShardReport(path, problem or shard_problem(path, shard) or _row_problem(path, shard)))
        if progress:
            progress(shard.num_bytes)
    for graph_file in snapshot.metadata.transform_files:
        path = snapshot.paths.absolute(graph_file.path)
        reports.append(ShardReport(path, shard_problem(path, graph_file)))
    return reports


def _block_problem(path: str, shard: ShardInfo) -> str:
    """'' when every block matches its CRC32C in the manifest (or none is recorded: format 1.0), else the first
    bad block, by number: the whole-file CRC32C says only that some byte is wrong."""
    if not shard.block_crc32c:
        return ""
    try:
        with storage.open_random_access(path) as handle:
            layout = block_io.read_layout(handle, shard.num_bytes)
            if len(layout.blocks) != len(shard.block_crc32c):
                return f"{path}: its footer lists {len(layout.blocks)} blocks, the manifest {len(shard.block_crc32c)}"
            for index, (span, expected) in enumerate(zip(layout.blocks, shard.block_crc32c, strict=True)):
                found = google_crc32c.value(block_io.read_exactly(handle, span.offset, span.length))
                if found != expected:
                    return (
                        f"{path}: block {index} CRC32C {found:08x} differs from the manifest's {expected:08x} "
                        f"(corrupt bytes)"
                    )
    except ValueError as exc:  # a garbled footer, or a file cut short (block_io.ShortReadError)
        return f"{path}: unreadable ({exc})"
    return ""


def _row_problem(path: str, shard: ShardInfo) -> str:
    try:
        with storage.open_random_access(path) as handle:
            shard_reader = shard_codec.open_shard(handle, path)
            rows = [shard_reader.get_batch(i).num_rows for i in range(shard_reader.num_record_batches)]
    except CorruptSnapshotError as exc:
        return str(exc)
    if rows != list(shard.block_rows):
        return f"{path}: its blocks hold {sum(rows)} rows, the manifest says {shard.num_rows}"
    return ""


def shard_problem(path: str, shard: ShardInfo | RunFile, *, checksum: bool = True) -> str:
    """'' when the shard (or another file of the run the manifest lists) matches the manifest, else what is wrong.

    Without ``checksum`` only the size is compared (a stat, no read).
    """
    try:
        if checksum:
            with storage.open_random_access(path) as handle:
                crc, size = shard_codec.checksum_file(handle)
        else:
            crc, size = shard.crc32c, storage.file_size(path)
    except FileNotFoundError:
        return f"{path}: missing"
    if size != shard.num_bytes:
        return f"{path}: {size} bytes on disk, the manifest says {shard.num_bytes} (truncated or overwritten)"
    if crc != shard.crc32c:
        return f"{path}: CRC32C {crc:08x} differs from the manifest's {shard.crc32c:08x} (corrupt bytes)"
    return ""


def _snapshot_dirs(root: str) -> list[SnapshotPaths]:
    return [
        SnapshotPaths(root, entry.name)
        for entry in storage.list_dir(root)
        if entry.is_dir and paths.is_valid_snapshot_id(entry.name)
    ]


def _is_snapshot_dir(path: str) -> bool:
    return storage.exists(paths.join(path, paths.PENDING_MARKER)) or storage.exists(
        paths.join(path, paths.FINAL_MARKER)
    )


def folder_paths(path: str) -> SnapshotPaths:
    """``path`` read as a snapshot's own folder: its parent the root, its name the snapshot id."""
    stripped = path.rstrip("/")
    return SnapshotPaths(paths.dirname(stripped), paths.basename(stripped))


def _candidates(root: str, snapshot_name: str | None, snapshot_id: str | None) -> list[SnapshotPaths]:
    if not storage.is_dir(root):
        raise SnapshotNotFoundError(
            f"no snapshot root at {root}: materialize one first with "
            f"`python -m beam_jobs.materialize --output={root} ...`, or check the path"
        )
    if _is_snapshot_dir(root):
        return [folder_paths(root)]
    found = _snapshot_dirs(root)
    if snapshot_id is not None:
        found = [s for s in found if s.snapshot_id == snapshot_id]
    if not found:
        wanted = f" with id {snapshot_id}" if snapshot_id else ""
        raise SnapshotNotFoundError(f"no snapshot{wanted} under {root}; `snapfeed list {root}` shows what is there")
    return found


def _describe(snapshot: SnapshotPaths, manifest: Manifest) -> str:
    name = f" name={manifest.snapshot_name}" if manifest.snapshot_name else ""
    return (
        f"{snapshot.snapshot_id}{name} created={format_time(manifest.finalize_time)} "
        f"rows={manifest.num_rows} shards={len(manifest.shards)}"
    )


def _describe_pending(marker: PendingMarker, status: str) -> str:
    """What became of a pending run, in one clause: failed when, abandoned why, or pending since when."""
    if status == state_machine.FAILED:
        return describe_pending(marker)
    if status == state_machine.ABANDONED:
        return f"{describe_pending(marker)} was abandoned: that process is gone"
    if status == state_machine.EXPIRED:
        hours = state_machine.DEFAULT_EXPIRY_SECONDS / 3600
        return f"{describe_pending(marker)} was abandoned: not finalized within the {hours:g} h expiry"
    return f"pending by {describe_pending(marker)}"


def _not_finalized(root: str, pending: dict[str, tuple[SnapshotPaths, PendingMarker]]) -> Exception:
    """Why nothing under ``root`` is readable; ``live_writer`` says whether waiting for a writer can help."""
    if not pending:
        return SnapshotNotFoundError(f"no finalized snapshot under {root} (no markers found)")
    now = time.time()
    statuses = {snapshot_id: writer_process.run_status(marker, now=now) for snapshot_id, (_, marker) in pending.items()}
    described = "; ".join(
        f"{snapshot_id}: {_describe_pending(marker, statuses[snapshot_id])}"
        for snapshot_id, (_, marker) in sorted(pending.items())
    )
    live = state_machine.PENDING in statuses.values()
    advice = (
        "Wait for the writer (reader.open_snapshot(..., wait_seconds=...)), rerun the materialize job,"
        if live
        else "No writer will finalize it: rerun the materialize job (it takes the snapshot over at once),"
    )
    _, first = next(iter(pending.values()))
    return SnapshotInProgressError(
        f"no finalized snapshot under {root}: {described}. {advice} or read what is committed with mode='read'",
        run_id=first.run_id,
        start_time=first.start_time,
        live_writer=live,
    )


def _finalized_at(root: str) -> tuple[SnapshotPaths, Manifest] | None:
    """``root`` itself as a finalized snapshot, from its manifest alone (None: it is not one, or cannot be read).

    One read, where telling a snapshot's folder from a folder of snapshots first
    (``_candidates``) took two more round trips to a bucket, a listing and a HEAD:
    0.05 s of a ``gs://`` snapshot's first batch through the 20 ms proxy.
    """
    storage.check_reachable(root)  # its errors name the path given, not the marker's
    snapshot = folder_paths(root)
    if not snapshot.snapshot_id or snapshot.directory != root.rstrip("/"):
        return None  # a bucket or the filesystem's root: never a snapshot's folder
    try:
        manifest = metadata.read_manifest(snapshot)
    except StorageError:
        raise  # the store failed: searching would only fail again
    except OSError:
        return None  # not a folder, or unreadable: the full search says what is wrong
    return None if manifest is None else (snapshot, manifest)


def _named(snapshot: SnapshotPaths, manifest: Manifest, snapshot_name: str | None) -> bool:
    return snapshot_name is None or snapshot_name in (manifest.snapshot_name, snapshot.snapshot_id)


def _choose(root: str, snapshot_name: str | None, snapshot_id: str | None, mode: str) -> Snapshot:
    at_root = _finalized_at(root)
    if at_root is not None and _named(*at_root, snapshot_name):
        return Snapshot(*at_root)
    finalized: list[tuple[SnapshotPaths, Manifest]] = []
    pending: dict[str, tuple[SnapshotPaths, PendingMarker]] = {}
    for snapshot in _candidates(root, snapshot_name, snapshot_id):
        manifest = metadata.read_manifest(snapshot)
        if manifest is not None:
            if _named(snapshot, manifest, snapshot_name):
                finalized.append((snapshot, manifest))
            continue
        marker = metadata.read_pending(snapshot)
        if marker is not None and (snapshot_name is None or snapshot_name == snapshot.snapshot_id):
            pending[snapshot.snapshot_id] = (snapshot, marker)
    if len(finalized) == 1:
        return Snapshot(*finalized[0])
    if len(finalized) > 1:
        listing = "\n  ".join(_describe(s, m) for s, m in sorted(finalized, key=lambda f: f[1].finalize_time))
        raise UsageError(
            f"{len(finalized)} finalized snapshots under {root}; choose one with snapshot_name= or snapshot_id=:\n  "
            + listing
        )
    if mode == "read" and len(pending) == 1:
        return _committed_so_far(*next(iter(pending.values())))
    raise _not_finalized(root, pending)


def _committed_so_far(snapshot: SnapshotPaths, marker: PendingMarker) -> Snapshot:
    """A manifest built from the shards a pending run has renamed into place."""
    shards, schema = [], None
    for entry in storage.list_dir(snapshot.run_dir(marker.run_id)):
        if not entry.name.endswith(paths.SHARD_SUFFIX):
            continue
        with storage.open_random_access(entry.path) as handle:
            shard_reader = shard_codec.open_shard(handle, entry.path)
            block_rows = [shard_reader.get_batch(i).num_rows for i in range(shard_reader.num_record_batches)]
            schema = schema or shard_reader.schema
        shards.append(
            ShardInfo(
                path=snapshot.relative(entry.path),
                num_rows=sum(block_rows),
                num_bytes=entry.size,
                block_rows=block_rows,
            )
        )
    if schema is None:
        raise SnapshotInProgressError(
            f"{snapshot.directory} is pending ({describe_pending(marker)}) and has committed no shard yet",
            run_id=marker.run_id,
            start_time=marker.start_time,
            live_writer=writer_process.run_status(marker, now=time.time()) == state_machine.PENDING,
        )
    warnings.warn(
        f"reading the {len(shards)} shards committed so far by pending {describe_pending(marker)} "
        f"of {snapshot.directory}; the snapshot is not finalized and may be incomplete",
        stacklevel=3,
    )
    manifest = manifests.build(
        schema,
        shards,
        format_version=marker.format_version,
        snapshot_id=snapshot.snapshot_id,
        run_id=marker.run_id,
        start_time=marker.start_time,
    )
    return Snapshot(snapshot, manifest, finalized=False)


def as_snapshot(source: str | Snapshot) -> Snapshot:
    """What an entry point reads: a snapshot already opened (``open_snapshot`` chooses among several under a root),
    or the one a path names."""
    return source if isinstance(source, Snapshot) else open_snapshot(str(source))


def open_snapshot(
    root: str,
    *,
    snapshot_name: str | None = None,
    snapshot_id: str | None = None,
    mode: str = "auto",
    wait_seconds: float = 0,
    poll_seconds: float = 1.0,
) -> Snapshot:
    """The one finalized snapshot under ``root`` (or the one chosen by name or id), for ``reader.distributed_dataset``.

    A run that failed, or was abandoned (its process is gone, or it is older
    than the RFC's 24 h expiry), raises at once saying so, even while waiting.

    Args:
        root: a snapshot root (the job's ``--output``: local, ``gs://``, ``s3://``) or one snapshot's folder.
        snapshot_name: the snapshot of that name, when the root holds several.
        snapshot_id: the snapshot of that fingerprint directory, when the root holds several.
        mode: ``"auto"`` (finalized snapshots only) or ``"read"`` (a pending snapshot's committed shards, with a warning).
        wait_seconds: how long to wait for a pending snapshot to be finalized while a writer may still finalize it.
        poll_seconds: how often the wait looks again.
    """
    if isinstance(root, Snapshot):
        raise UsageError(f"{root.path} is an opened snapshot: give open_snapshot the root or folder it was opened from")
    if mode not in READ_MODES:
        raise UsageError(f"mode={mode!r}; choose 'auto' (finalized only) or 'read' (what is committed)")
    root = str(root)
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return _choose(root, snapshot_name, snapshot_id, mode)
        except SnapshotInProgressError as error:
            if not error.live_writer or time.monotonic() >= deadline:
                raise
            time.sleep(min(poll_seconds, max(0.0, deadline - time.monotonic())))
