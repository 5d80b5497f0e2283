"""Gathering a step's rows out of loaded windows into one batch, each row written once.

A step's rows are a range of the epoch stream; they lie in one or more
consecutive windows, in each at the positions its row order gives (stored
order when unshuffled). Every kind of loaded window copies its rows into the
batch itself (``LoadedWindow``):

- ``ColumnsWindow``: one array per column (a window read into its buffer, or
  fresh memory). Shuffled rows are gathered with one ``take`` per column;
  unshuffled rows within one window are returned as views, not copied.
- ``DecodedParts``: large rows, shuffled, gathered row by row from their
  decoded blocks. Copying a whole window into one array before gathering costs
  a full extra pass over memory; with rows of tens of kilobytes the per-row
  call is noise next to the copy. Smaller rows keep the window copy (one
  ``take`` per batch beats per-row or per-block calls; measured, see the
  reader bench notes).
- ``reader.core.direct_gather.DirectWindow``: large rows of direct shards, not read
  yet: read straight into their slots, the rows of every such window of the
  batch in one go at the end.

Shuffled rows go straight from their window to their slot, also when the batch
spans windows (no concatenation pass). A batch's memory comes from the
pipeline's ``reader.core.allocator.BatchAllocator`` (in a DataLoader worker: a slot
of its shared-memory ring, so the batch crosses to the training process as it is).
"""

from __future__ import annotations

import bisect
import functools
from typing import TYPE_CHECKING, Protocol

import numpy as np

from reader.core import direct_gather
from reader.core.allocator import BatchAllocator, new_batch
from reader.core.blocks import Columns

if TYPE_CHECKING:
    from reader.core.direct_gather import DirectWindow
    from reader.core.window_loader import WindowLoader


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
        return {name: values[slot : slot + rows] for name, values in self._out.items()}

    def gather_later(self, slot: int, window: DirectWindow, positions: np.ndarray) -> None:
        """Leaves the rows at ``positions`` of a direct window, for slots from ``slot`` on, to be read
        with those of every other direct window of the batch, in one go (``direct_gather.gather``)."""
        self._later.append((slot, window, positions))

    def build(self) -> Columns:
        if not self._later:
            return self._out
        segments = [(window, positions) for _, window, positions in self._later]
        # Every window direct: read straight into the batch; else into fresh memory, copied beside the rest.
        allocate = self._allocate if self._out is None else new_batch
        gathered = direct_gather.gather(segments, self._empty_batch, self._pool, self._threads, allocate)
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


class Gatherer:
    """Gathers stream rows into batches out of the windows a ``WindowLoader`` loads, across epochs."""

    def __init__(
        self, loader: WindowLoader, empty_batch: Columns, pool, threads: int, allocate: BatchAllocator
    ) -> None:
        self._loader = loader
        self._empty_batch = empty_batch
        self._new_batch = functools.partial(
            BatchBuilder, empty_batch=empty_batch, pool=pool, threads=threads, allocate=allocate
        )

    def gather(self, epoch: int, start: int, stop: int) -> Columns:
        """Stream rows ``[start, stop)`` of ``epoch``, written once into a new batch (or, unshuffled
        rows within one window, views of it)."""
        if start >= stop:
            return dict(self._empty_batch)
        windows, starts = self._loader.windows(epoch)
        index = bisect.bisect_right(starts, start) - 1
        self._loader.drop_before((epoch, index))
        batch, filled = self._new_batch(stop - start), 0
        while start < stop:
            window = windows[index]
            loaded, row_order = self._loader.window((epoch, index))
            lo, hi = start - window.start, min(stop, window.stop) - window.start
            rows = row_order[lo:hi] if row_order is not None else None
            if rows is None and filled == 0 and stop <= window.stop and (views := loaded.view(lo, hi)) is not None:
                return views
            loaded.copy_into(batch, filled, rows, lo, hi)
            filled += hi - lo
            start = window.start + hi
            index += 1
        return batch.build()
