"""Reading uncompressed shards straight into NumPy memory, each byte copied once from the page cache.

In a block of an uncompressed shard every fixed-width column (numbers and
fixed-shape tensors without nulls) is one contiguous run of bytes in the file,
so a row of a column is ``row_bytes`` bytes at a known file offset, and no
Arrow decode is needed to get at it.

- Where each run starts comes from Arrow's reader over a memory map: its
  buffers are zero-copy, so an address minus the map's base is a file offset.
  Finding them touches only the IPC metadata, never the data; the map is
  closed again.
- Small rows: a window's pieces are read with one ``preadv`` per piece and
  column into the window's reused buffer (``BlockSource.read_window``), which
  the batch is then gathered from, as a NumPy gather from RAM would. Measured
  against gathering straight out of a memory map of the shard (one copy
  instead of two): mapping the pages in and out again cost as much as the
  extra copy, all on the gathering thread, and was slower than reads that run
  on the other cores while it gathers.
- Large rows (``reader.core.options.LARGE_ROW_BYTES``) are read with ``preadv``
  straight into their slot of the batch, rows spread over the block threads
  and the gathering one: a syscall per row is noise next to copying it.

A shard truncated under a running reader is a ``CorruptSnapshotError`` naming
it (a read comes back short), never a crash.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from reader.core.allocator import BatchAllocator
from reader.core.plan import Piece
from schemas.errors import CorruptSnapshotError

if TYPE_CHECKING:
    from reader.core.gather import BatchBuilder

Columns = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class ColumnExtent:
    """Where a column of one block lies in the shard: row ``i`` at ``offset + i * row_bytes``."""

    offset: int
    row_bytes: int


@dataclasses.dataclass(frozen=True)
class BlockExtents:
    rows: int
    columns: dict[str, ColumnExtent]


def shard_extents(mapped: pa.MemoryMappedFile, dtypes: Mapping[str, np.dtype]) -> list[BlockExtents] | None:
    """Every block's extents of the ``dtypes`` columns of a mapped shard.

    None when any of those columns is not a plain run of bytes in the file (a
    compressed block, nulls, variable width, another dtype than expected): that
    shard is read the general way.
    """
    span = (mapped.read_buffer(1).address, mapped.size())
    mapped.seek(0)
    reader = ipc.open_file(mapped)
    blocks = []
    for index in range(reader.num_record_batches):
        batch = reader.get_batch(index)
        columns = {name: _column_extent(batch.column(name), dtype, span) for name, dtype in dtypes.items()}
        if None in columns.values():
            return None
        blocks.append(BlockExtents(batch.num_rows, columns))
    return blocks


def _column_extent(column: pa.Array, dtype: np.dtype, span: tuple[int, int]) -> ColumnExtent | None:
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    width = 1
    if pa.types.is_fixed_size_list(storage.type):
        if storage.null_count or storage.offset:
            return None
        width, storage = storage.type.list_size, storage.values
    value_type = storage.type
    if storage.null_count or not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)):
        return None
    if np.dtype(value_type.to_pandas_dtype()) != dtype:
        return None
    start = storage.buffers()[1].address + storage.offset * dtype.itemsize
    row_bytes = width * dtype.itemsize
    base, size = span
    if start < base or start + len(column) * row_bytes > base + size:
        return None  # decoded into memory of its own: the block is compressed
    return ColumnExtent(start - base, row_bytes)


class DirectShard:
    """One uncompressed shard, open for positioned reads, with where each column of each block lies."""

    def __init__(self, path: str, blocks: list[BlockExtents]) -> None:
        self.path = path
        self.blocks = blocks
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 - lives as long as the shard is read

    def row_offsets(self, name: str, piece: Piece) -> np.ndarray:
        extent = self.blocks[piece.block].columns[name]
        return extent.offset + np.arange(piece.start, piece.stop, dtype=np.int64) * extent.row_bytes

    def read_piece_into(self, piece: Piece, out: Columns) -> None:
        """Fills ``out`` (one array of ``piece.rows`` rows per column) with the piece: a read per column."""
        for name, values in out.items():
            extent = self.blocks[piece.block].columns[name]
            # cast() refuses a non-contiguous array instead of reading into a copy of it
            self.read_into(memoryview(values).cast("B"), extent.offset + piece.start * extent.row_bytes)

    def read_into(self, destination: memoryview, offset: int) -> None:
        """Fills ``destination`` with the shard's bytes from ``offset`` (one positioned read, GIL released)."""
        while destination:
            done = os.preadv(self._file.fileno(), [destination], offset)
            if done == 0:
                raise CorruptSnapshotError(
                    f"shard {self.path} ends at byte {offset}, short of a row the manifest lists; "
                    f"run `snapfeed verify` on the snapshot"
                )
            destination, offset = destination[done:], offset + done


class DirectWindow:
    """A window of large rows of direct shards: where each of its rows lies, nothing read yet."""

    def __init__(self, pieces: Sequence[Piece], shard: Callable[[int], DirectShard], names: Sequence[str]) -> None:
        self.shard = shard
        self.shard_of_row = np.repeat([p.shard for p in pieces], [p.rows for p in pieces])
        self.offsets = {name: np.concatenate([shard(p.shard).row_offsets(name, p) for p in pieces]) for name in names}

    def view(self, lo: int, hi: int) -> None:
        return None  # nothing read to view

    def copy_into(self, batch: BatchBuilder, slot: int, rows: np.ndarray | None, lo: int, hi: int) -> None:
        """Leaves its rows to the batch, read with those of its other direct windows in one go (``gather``)."""
        batch.gather_later(slot, self, np.arange(lo, hi) if rows is None else rows)


def gather(
    segments: Sequence[tuple[DirectWindow, np.ndarray]],
    empty_batch: Columns,
    pool,
    threads: int,
    allocate: BatchAllocator,
) -> Columns:
    """The rows at ``positions`` of each window, in order, as one new batch (from ``allocate``), each
    read into its slot.

    ``empty_batch`` gives each column's dtype and row shape. The rows are
    shared out between ``threads`` tasks of ``pool`` and the calling thread.
    """
    shard = segments[0][0].shard
    shard_of_row = np.concatenate([window.shard_of_row[positions] for window, positions in segments])
    rows = len(shard_of_row)
    batch = allocate(rows, empty_batch)
    shards = [shard(index) for index in shard_of_row.tolist()]
    flat = {name: memoryview(values).cast("B") for name, values in batch.items()}
    starts = {
        name: np.concatenate([window.offsets[name][positions] for window, positions in segments]).tolist()
        for name in empty_batch
    }
    shares = threads + 1

    def read(first: int) -> None:
        for name, destination in flat.items():
            width = len(destination) // rows
            for row in range(first, rows, shares):
                shards[row].read_into(destination[row * width : (row + 1) * width], starts[name][row])

    helpers = [pool.submit(read, share) for share in range(1, shares)]
    try:
        read(0)
    finally:
        for helper in helpers:
            helper.result()
    return batch
