"""Cutting a stream of row blocks into batches while counting, per source, the rows handed out.

Pure (NumPy only). A source is where rows came from: a split in
distributed_epoch, a worker in parallel_epochs. A row counts as delivered once
it is in a batch the consumer was handed, not when it arrived: the service
client acknowledges a split only when all of its rows are delivered, and its
``get_state`` records delivered rows per source, so neither a consumer that
dies with rows in its buffer nor a restore from a checkpoint loses or repeats a
row.

A block may come with the order its rows are to be delivered in (a split's
seeded shuffle): rows are then gathered in that order straight into the batch.
Workers do that (they cut what they send with this batcher too); the consumer
gets the rows in delivery order, cut where its batches are cut, so a batch that
arrived whole is handed out as it arrived, with no copy.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Hashable, Iterator

import numpy as np

from reader.core.allocator import Columns
from reader.core.batch import take_rows

#: (source, rows) in the order the rows appear in the batch
Delivered = list[tuple[Hashable, int]]


def _rows(block: Columns) -> int:
    return len(next(iter(block.values())))


@dataclasses.dataclass
class _Part:
    """A block waiting to be cut: rows ``order[taken:]`` (or ``taken:`` without an order) are left."""

    source: Hashable
    block: Columns
    order: np.ndarray | None
    rows: int
    taken: int = 0


class DeliveryBatcher:
    """Re-cuts tagged row blocks into batches of ``batch_size``; the last one partial unless dropped.

    ``head``: the first batch holds that many rows instead (a worker completing
    a batch the consumer started from an earlier split).
    """

    def __init__(self, batch_size: int, *, drop_remainder: bool, head: int = 0) -> None:
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._parts: collections.deque[_Part] = collections.deque()
        self._buffered = 0
        self._next_size = head or batch_size

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def buffered(self) -> int:
        """Rows received and not yet handed out."""
        return self._buffered

    def holding(self) -> set[Hashable]:
        """The sources some of whose rows are buffered: their blocks are still read from."""
        return {part.source for part in self._parts}

    def add(self, source: Hashable, block: Columns, order: np.ndarray | None = None) -> None:
        """Queues ``block``'s rows, in ``order`` (row indices into the block) when given."""
        rows = len(order) if order is not None else (_rows(block) if block else 0)
        if rows:
            self._parts.append(_Part(source, block, order, rows))
            self._buffered += rows

    def full_batches(self) -> Iterator[tuple[Columns, Delivered]]:
        """Every whole batch the buffer holds, with the rows each source contributed."""
        while self._buffered >= self._next_size:
            yield self._cut(self._next_size)
            self._next_size = self._batch_size

    def remainder(self) -> tuple[Columns | None, Delivered]:
        """The partial batch left (None when empty or dropped); dropped rows count as delivered."""
        self._next_size = self._batch_size
        if not self._buffered:
            return None, []
        batch, delivered = self._cut(self._buffered)
        return (None if self._drop_remainder else batch), delivered

    def _cut(self, rows: int) -> tuple[Columns, Delivered]:
        pieces: list[tuple[_Part, int, int]] = []
        delivered: Delivered = []
        while rows:
            part = self._parts[0]
            take = min(rows, part.rows - part.taken)
            pieces.append((part, part.taken, part.taken + take))
            part.taken += take
            if part.taken == part.rows:
                self._parts.popleft()
            if delivered and delivered[-1][0] == part.source:
                delivered[-1] = (part.source, delivered[-1][1] + take)
            else:
                delivered.append((part.source, take))
            rows -= take
            self._buffered -= take
        return _assemble(pieces), delivered


def _assemble(pieces: list[tuple[_Part, int, int]]) -> Columns:
    """The batch: views when it is one unordered stretch of one block, else one gather per piece."""
    (first, lo, hi) = pieces[0]
    if len(pieces) == 1 and first.order is None:
        return {name: values[lo:hi] for name, values in first.block.items()}
    total = sum(hi - lo for _, lo, hi in pieces)
    out = {name: np.empty((total, *values.shape[1:]), values.dtype) for name, values in first.block.items()}
    filled = 0
    for part, lo, hi in pieces:
        for name, values in part.block.items():
            target = out[name][filled : filled + hi - lo]
            if part.order is None:
                target[...] = values[lo:hi]
            else:
                take_rows(values, part.order[lo:hi], target)
        filled += hi - lo
    return out
