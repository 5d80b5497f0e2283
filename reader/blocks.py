"""Reading pieces of blocks from shards into NumPy columns.

Blocks are read with positioned reads and decompressed by Arrow with the GIL
released, so many threads read at once. Uncompressed fixed-width columns of
local shards skip Arrow: they are read straight into the window's buffer, or
for large rows into the batch (``reader.direct_gather``).
Every shard is checked against the manifest the first time it is opened: its
size always (a truncated shard is named even without checksums), its CRC32C
when ``verify_checksums``.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from reader.direct_gather import DirectShard, DirectWindow, shard_extents
from reader.plan import Piece
from reader.snapshot import Snapshot, shard_problem
from schemas import columns, shard_codec, storage
from schemas.errors import CorruptSnapshotError

Columns = dict[str, np.ndarray]


class BlockSource:
    """Thread-safe reads of ``Piece``s of one snapshot, projected to ``column_names``."""

    def __init__(self, snapshot: Snapshot, column_names: Sequence[str], *, verify_checksums: bool) -> None:
        self._snapshot = snapshot
        self._columns = list(column_names)
        self._verify = verify_checksums
        self._files: dict[int, object] = {}
        self._direct: dict[int, DirectShard | None] = {}
        self._open_lock = threading.Lock()
        self._local = threading.local()

    def _file(self, shard: int):
        """The shard's file, checked against the manifest and opened once for all threads.

        Blocks are read with positioned reads (thread-safe), not memory maps:
        mapped pages would count in the trainer's RSS for the whole snapshot.
        """
        with self._open_lock:
            if shard in self._files:
                return self._files[shard]
            info = self._snapshot.metadata.shards[shard]
            path = self._snapshot.shard_path(shard)
            problem = shard_problem(path, info, checksum=self._verify)
            if problem:
                raise CorruptSnapshotError(
                    f"shard {problem}. Run `snapfeed verify {self._snapshot.path}` and materialize again with --mode=write."
                )
            self._files[shard] = storage.open_random_access(path)
            return self._files[shard]

    def _direct_shard(self, shard: int) -> DirectShard | None:
        """The shard opened for direct gathers, when its projected columns allow them."""
        if shard not in self._direct:
            self._file(shard)  # checked against the manifest first
            with self._open_lock:
                if shard not in self._direct:
                    self._direct[shard] = self._open_direct(shard)
        return self._direct[shard]

    def _open_direct(self, shard: int) -> DirectShard | None:
        info = self._snapshot.metadata.shards[shard]
        local = storage.local_path(self._snapshot.shard_path(shard))
        spec = self._snapshot.element_spec
        if (info.compression or self._snapshot.metadata.compression) != "none" or local is None:
            return None
        if not all(spec[name].fixed_width for name in self._columns):
            return None  # strings, bytes and lists have offsets, not fixed-width rows
        try:
            with pa.memory_map(local) as mapped:
                extents = shard_extents(mapped, {name: np.dtype(spec[name].dtype) for name in self._columns})
        except (pa.ArrowException, OSError) as exc:
            raise self._unreadable(f"shard {local}", exc) from exc
        if not extents or [block.rows for block in extents] != list(info.block_rows):
            return None  # the general path reads it (and names any mismatch)
        return DirectShard(local, extents)

    def _unreadable(self, what: str, exc: Exception) -> CorruptSnapshotError:
        """The one error for damaged bytes, whether the direct path or Arrow's decoder (any codec) met them."""
        detail = " ".join(str(exc).split())  # Arrow pads some messages with hundreds of spaces
        return CorruptSnapshotError(
            f"{what} is unreadable ({detail}): it is corrupt; run `snapfeed verify {self._snapshot.path}` "
            f"and materialize the snapshot again with --mode=write"
        )

    def direct_window(self, pieces: Sequence[Piece]) -> DirectWindow | None:
        """The pieces as a window to gather from in place; None unless every shard allows it."""
        if not pieces or any(self._direct_shard(shard) is None for shard in {p.shard for p in pieces}):
            return None
        return DirectWindow(pieces, self._direct_shard, self._columns)

    def _reader(self, shard: int) -> pa.ipc.RecordBatchFileReader:
        readers = getattr(self._local, "readers", None)
        if readers is None:
            readers = self._local.readers = {}
        if shard not in readers:
            # A reader per thread over the shared file: its ReadAt is a thread-safe pread.
            readers[shard] = shard_codec.open_shard(self._file(shard), self._snapshot.shard_path(shard))
        return readers[shard]

    def read(self, piece: Piece) -> Columns:
        block = self.read_arrow(piece)
        return {name: columns.column_to_numpy(block.column(name)) for name in self._columns}

    def read_arrow(self, piece: Piece) -> pa.RecordBatch:
        """The piece as an Arrow record batch of the projected columns (what service workers stream)."""
        path = self._snapshot.shard_path(piece.shard)
        try:
            block = self._reader(piece.shard).get_batch(piece.block)
        except CorruptSnapshotError:
            raise
        except (pa.ArrowException, OSError) as exc:
            raise self._unreadable(f"block {piece.block} of shard {path}", exc) from exc
        expected = self._snapshot.metadata.shards[piece.shard].block_rows[piece.block]
        if block.num_rows != expected:
            raise CorruptSnapshotError(
                f"block {piece.block} of shard {path} has {block.num_rows} rows, the manifest says {expected}"
            )
        if piece.start or piece.stop != block.num_rows:
            block = block.slice(piece.start, piece.rows)
        return block.select(self._columns)

    def read_window(self, pieces: Sequence[Piece], pool, buffer: WindowBuffer | None = None) -> Loading:
        """Starts reading all pieces on ``pool``; the result is one array per column, pieces in order.

        With a ``buffer`` each piece is read into its place in the buffer's
        reused arrays (straight from the file for direct shards), so the result
        is only valid until the buffer is reused; without one it is fresh memory.
        """
        if buffer is None:
            return Loading(pool, [functools.partial(self.read, piece) for piece in pieces], self._concatenate)
        out = buffer.arrays(self._snapshot, self._columns, sum(piece.rows for piece in pieces))
        offsets = np.cumsum([0] + [piece.rows for piece in pieces]).tolist()

        def fill(index: int) -> None:
            piece = pieces[index]
            target = {name: out[name][offsets[index] : offsets[index + 1]] for name in self._columns}
            if direct := self._direct_shard(piece.shard):
                direct.read_piece_into(piece, target)
                return
            part = self.read(piece)
            for name in self._columns:
                target[name][...] = part[name]

        return Loading(pool, [functools.partial(fill, index) for index in range(len(pieces))], lambda _: out)

    def _concatenate(self, parts: list[Columns]) -> Columns:
        if len(parts) == 1:
            return parts[0]
        return {name: np.concatenate([part[name] for part in parts]) for name in self._columns}


class Loading:
    """Reads started on a pool; ``result()`` waits for them and assembles what they read.

    Reads are submitted by whoever needs them, in the order they are needed, so
    one pool serves every window and no pool thread waits on another's tasks.
    The first caller of ``result()`` runs the reads no pool thread has started
    yet itself (from the last one back, while the pool works from the first),
    so it helps instead of idling.
    """

    _PENDING = object()

    def __init__(self, pool, reads: list[Callable[[], object]], assemble: Callable[[list], object]) -> None:
        self._reads = reads
        self._tasks = [pool.submit(read) for read in reads]
        self._assemble = assemble
        self._result = self._PENDING

    def result(self):
        if self._result is self._PENDING:
            results = [None] * len(self._tasks)
            for index in reversed(range(len(self._tasks))):
                if self._tasks[index].cancel():
                    results[index] = self._reads[index]()
            for index, task in enumerate(self._tasks):
                if not task.cancelled():
                    results[index] = task.result()
            self._result = self._assemble(results)
        return self._result

    def cancel(self) -> None:
        """Cancels the reads not started and waits for the others (they may write into shared buffers)."""
        for task in self._tasks:
            task.cancel()
        concurrent.futures.wait(self._tasks)


class WindowBuffer:
    """Per-column arrays reused from window to window.

    Sized for ``capacity`` rows (the largest window of the pipeline) the first
    time, so windows of a few rows more than the last never allocate (and
    page-fault) fresh memory; grown only when a window is larger still.
    """

    def __init__(self, capacity: int = 0) -> None:
        self._capacity = capacity
        self._arrays: Columns = {}

    def arrays(self, snapshot: Snapshot, names: Sequence[str], rows: int) -> Columns:
        spec = snapshot.element_spec
        for name in names:
            current = self._arrays.get(name)
            if current is None or len(current) < rows:
                self._arrays[name] = spec[name].empty(max(rows, self._capacity))
        return {name: self._arrays[name][:rows] for name in names}
