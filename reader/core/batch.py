"""A batch being filled: the kinds of loaded window and how each writes its rows into the batch.

A step's rows lie in one or more consecutive windows of the epoch stream
(``reader.core.gather`` finds them); every kind of loaded window copies its
rows into the ``BatchBuilder`` itself (``LoadedWindow``):

- ``ColumnsWindow``: one array per column (a window read into its buffer, or
  fresh memory). Shuffled rows are gathered with one ``take`` per column;
  unshuffled rows within one window are returned as views, not copied.
- ``DecodedParts``: large rows, shuffled, gathered row by row from their
  decoded blocks. Copying a whole window into one array before gathering costs
  a full extra pass over memory; with rows of tens of kilobytes the per-row
  call is noise next to the copy. Smaller rows keep the window copy (one
  ``take`` per batch beats per-row or per-block calls; measured, see the
  reader bench notes).
- ``DirectWindow``: large rows (``reader.core.options.LARGE_ROW_BYTES``) of
  direct shards (``reader.core.direct_shard``), not read yet: each row is read
  with ``preadv`` straight into its slot of the batch, the rows of every such
  window of the batch in one go at the end (``gather_direct``), spread over
  the block threads and the gathering one: a syscall per row is noise next to
  copying it. Small rows of direct shards are read into the window's buffer
  first (``reader.core.blocks``) and gathered from there, as a NumPy gather
  from RAM would: measured against gathering straight out of a memory map of
  the shard (one copy instead of two), mapping the pages in and out again cost
  as much as the extra copy, all on the gathering thread.

Shuffled rows go straight from their window to their slot, also when the batch
spans windows (no concatenation pass). A batch's memory comes from the
pipeline's ``reader.core.allocator.BatchAllocator`` (in a DataLoader worker: a slot
of its shared-memory ring, so the batch crosses to the training process as it is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from reader.core.allocator import BatchAllocator, Columns, new_batch
from reader.core.direct_shard import DirectShard
from reader.core.plan import Piece


def take_rows(values: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = values[positions[i]]``, one pass over memory.

    ``positions`` are in range by construction. With NumPy's default
    ``mode="raise"`` a ``take`` into ``out`` gathers into a temporary and copies
    that over ``out`` (so a bad index leaves ``out`` untouched): a second pass
    that cost a third of the gather.
    """
    np.take(values, positions, axis=0, out=out, mode="clip")


class BatchBuilder:
    """A batch being filled, segment by segment, window by window."""

    def __init__(self, rows: int, empty_batch: Columns, pool, threads: int, allocate: BatchAllocator) -> None:
        self._rows = rows
        self._empty_batch = empty_batch
        self._pool = pool
        self._threads = threads
        self._allocate = allocate
        self._out: Columns | None = None
        self._later: list[tuple[int, DirectWindow, np.ndarray]] = []  # (slot, window, positions in it)

    def segment(self, slot: int, rows: int) -> Columns:
        """Rows ``[slot, slot + rows)`` of the batch, to be written now."""
        if self._out is None:
            self._out = self._allocate(self._rows, self._empty_batch)
        if slot == 0 and rows == self._rows:
            return self._out  # the whole batch from one window: no views to make
        return {name: values[slot : slot + rows] for name, values in self._out.items()}

    def gather_later(self, slot: int, window: DirectWindow, positions: np.ndarray) -> None:
        """Leaves the rows at ``positions`` of a direct window, for slots from ``slot`` on, to be read
        with those of every other direct window of the batch, in one go (``gather_direct``)."""
        self._later.append((slot, window, positions))

    def build(self) -> Columns:
        if not self._later:
            return self._out
        segments = [(window, positions) for _, window, positions in self._later]
        # Every window direct: read straight into the batch; else into fresh memory, copied beside the rest.
        allocate = self._allocate if self._out is None else new_batch
        gathered = gather_direct(segments, self._empty_batch, self._pool, self._threads, allocate)
        if self._out is None:
            return gathered
        done = 0
        for slot, _, positions in self._later:  # beside windows of shards read the general way
            for name, values in gathered.items():
                self._out[name][slot : slot + len(positions)] = values[done : done + len(positions)]
            done += len(positions)
        return self._out


class LoadedWindow(Protocol):
    """A window's rows, ``0 .. rows`` in stored order, ready to be gathered into batches."""

    def view(self, lo: int, hi: int) -> Columns | None:
        """Rows ``[lo, hi)`` as views of the window (None: it has no such views)."""

    def copy_into(self, batch: BatchBuilder, slot: int, rows: np.ndarray | None, lo: int, hi: int) -> None:
        """Writes its rows at positions ``rows`` (None: ``[lo, hi)`` in order) into ``batch`` from ``slot`` on.

        Written now, or left to ``batch.build()``, never later: the window's
        buffer may be reloaded once the gatherer moves on.
        """


class ColumnsWindow:
    """A window read into one array per column."""

    def __init__(self, columns: Columns) -> None:
        self._columns = columns

    def view(self, lo: int, hi: int) -> Columns:
        return {name: values[lo:hi] for name, values in self._columns.items()}

    def copy_into(self, batch: BatchBuilder, slot: int, rows: np.ndarray | None, lo: int, hi: int) -> None:
        segment = batch.segment(slot, hi - lo)
        for name, values in self._columns.items():
            if rows is None:
                segment[name][...] = values[lo:hi]
            else:
                take_rows(values, rows, segment[name])


class DecodedParts:
    """A window held as its decoded pieces (dicts of equally long columns), in stream order."""

    def __init__(self, parts: list[Columns]) -> None:
        self._parts = parts
        self._offsets = np.cumsum([0] + [len(next(iter(part.values()))) for part in parts])

    def view(self, lo: int, hi: int) -> None:
        return None

    def copy_into(self, batch: BatchBuilder, slot: int, rows: np.ndarray | None, lo: int, hi: int) -> None:
        rows = np.arange(lo, hi) if rows is None else rows
        out = batch.segment(slot, hi - lo)
        part_of = (np.searchsorted(self._offsets, rows, side="right") - 1).tolist()
        local = (rows - self._offsets[part_of]).tolist()
        for name, destination in out.items():
            sources = [part[name] for part in self._parts]
            for index, (part, row) in enumerate(zip(part_of, local, strict=True)):
                destination[index] = sources[part][row]


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


def gather_direct(
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
