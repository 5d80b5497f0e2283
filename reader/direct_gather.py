"""Gathering batches straight out of uncompressed shards, each byte copied once.

In a block of an uncompressed shard every fixed-width column (numbers and
fixed-shape tensors without nulls) is one contiguous run of bytes in the file,
so a row of a column is ``row_bytes`` bytes at a known file offset. A batch is
then gathered from the page cache in one pass, as a NumPy gather from RAM
would: no read into a buffer, no Arrow decode, no window copy (the general path
does all three before it gathers).

- Where each run starts comes from Arrow's reader over a memory map: its
  buffers are zero-copy, so an address minus the map's base is a file offset.
  Finding them touches only the IPC metadata, never the data.
- Small rows are gathered with one fancy index per column into a strided view
  of the map (row ``k`` of the view is the ``row_bytes`` bytes at offset
  ``k``). Pages are dropped from the mapping (``MADV_DONTNEED``) whenever a
  window is done, so RSS holds about one window, not the snapshot; the page
  cache keeps them.
- Large rows (``reader.options.LARGE_ROW_BYTES``) are read with ``preadv`` straight into their
  slot of the batch, rows spread over the block threads: a syscall per row is
  noise next to copying it, the copies run on every core, and the map's page
  faults (several per large row) are avoided.

A shard truncated *while mapped* would fault (SIGBUS) instead of raising:
shards are immutable once finalized, sizes are checked when a shard is first
opened, and ``gc`` unlinks (the map keeps the old file alive), so only a hand
edit of a finalized snapshot under a running reader can do that.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from reader.plan import Piece
from schemas.errors import CorruptSnapshotError

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
    """One uncompressed shard, open and mapped read-only, with a gatherable view per column."""

    def __init__(self, path: str, blocks: list[BlockExtents]) -> None:
        self.path = path
        self.blocks = blocks
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 - lives as long as the shard is read
        self._map = mmap.mmap(self._file.fileno(), 0, prot=mmap.PROT_READ)
        raw = np.frombuffer(self._map, np.uint8)
        widths = {name: extent.row_bytes for name, extent in blocks[0].columns.items()} if blocks else {}
        self.views = {
            name: np.lib.stride_tricks.as_strided(raw, (len(raw) - width + 1, width), (1, 1), writeable=False)
            for name, width in widths.items()
        }

    def row_offsets(self, name: str, piece: Piece) -> np.ndarray:
        extent = self.blocks[piece.block].columns[name]
        return extent.offset + np.arange(piece.start, piece.stop, dtype=np.int64) * extent.row_bytes

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

    def release(self) -> None:
        """Drops every page of the shard from this process's mapping (not from the page cache).

        The whole map, not just the finished window's blocks: a fault maps the
        pages around it too (fault-around), and those would otherwise stay.
        """
        self._map.madvise(mmap.MADV_DONTNEED)


class DirectWindow:
    """A window of pieces of direct shards: where each of its rows lies, nothing copied."""

    def __init__(self, pieces: Sequence[Piece], shard: Callable[[int], DirectShard], names: Sequence[str]) -> None:
        self._pieces = list(pieces)
        self.shard = shard
        self.shard_of_row = np.repeat([p.shard for p in pieces], [p.rows for p in pieces])
        self.offsets = {name: np.concatenate([shard(p.shard).row_offsets(name, p) for p in pieces]) for name in names}

    def release(self) -> None:
        for shard in {piece.shard for piece in self._pieces}:
            self.shard(shard).release()


def gather(
    segments: Sequence[tuple[DirectWindow, np.ndarray]], empty_batch: Columns, *, row_readers=None, threads: int = 1
) -> Columns:
    """The rows at ``positions`` of each window, in order, as one new batch.

    ``empty_batch`` gives each column's dtype and row shape. With
    ``row_readers`` (an executor; large rows) each row is read into its slot,
    rows spread over ``threads`` tasks; else each column is one fancy index.
    """
    shard = segments[0][0].shard
    shard_of_row = np.concatenate([window.shard_of_row[positions] for window, positions in segments])
    offsets = {
        name: np.concatenate([window.offsets[name][positions] for window, positions in segments])
        for name in empty_batch
    }
    if row_readers is not None:
        return _read_rows(shard, shard_of_row, offsets, empty_batch, row_readers, threads)
    shards = np.unique(shard_of_row)
    batch = {}
    for name, empty in empty_batch.items():
        if len(shards) == 1:
            gathered = shard(int(shards[0])).views[name][offsets[name]]
        else:
            gathered = np.empty((len(shard_of_row), shard(int(shards[0])).views[name].shape[1]), np.uint8)
            for index in shards.tolist():
                chosen = shard_of_row == index
                gathered[chosen] = shard(index).views[name][offsets[name][chosen]]
        batch[name] = gathered.view(empty.dtype).reshape(len(shard_of_row), *empty.shape[1:])
    return batch


def _read_rows(shard, shard_of_row, offsets, empty_batch: Columns, pool, threads: int) -> Columns:
    rows = len(shard_of_row)
    batch = {name: np.empty((rows, *empty.shape[1:]), empty.dtype) for name, empty in empty_batch.items()}
    shards = [shard(index) for index in shard_of_row.tolist()]
    flat = {name: memoryview(values.reshape(-1).view(np.uint8)) for name, values in batch.items()}
    starts = {name: column.tolist() for name, column in offsets.items()}

    def read(first: int) -> None:
        for name, destination in flat.items():
            width = len(destination) // rows
            for row in range(first, rows, threads):
                shards[row].read_into(destination[row * width : (row + 1) * width], starts[name][row])

    for _ in pool.map(read, range(threads)):
        pass
    return batch
