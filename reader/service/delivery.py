"""Cutting a stream of row blocks into batches while counting, per source, the rows handed out.

Pure (NumPy only). A source is where rows came from: a split in
distributed_epoch, a worker in parallel_epochs. A row counts as delivered once
it is in a batch the consumer was handed, not when it arrived: the service
client acknowledges a split only when all of its rows are delivered, and its
``get_state`` records delivered rows per source, so neither a consumer that
dies with rows in its buffer nor a restore from a checkpoint loses or repeats a
row.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterator

import numpy as np

from reader.blocks import Columns

#: (source, rows) in the order the rows appear in the batch
Delivered = list[tuple[Hashable, int]]


def _rows(block: Columns) -> int:
    return len(next(iter(block.values())))


class DeliveryBatcher:
    """Re-cuts tagged row blocks into batches of ``batch_size``; the last one partial unless dropped."""

    def __init__(self, batch_size: int, *, drop_remainder: bool) -> None:
        self._batch_size = batch_size
        self._drop_remainder = drop_remainder
        self._parts: collections.deque[tuple[Hashable, Columns]] = collections.deque()
        self._buffered = 0

    @property
    def buffered(self) -> int:
        """Rows received and not yet handed out."""
        return self._buffered

    def add(self, source: Hashable, block: Columns) -> None:
        if rows := _rows(block):
            self._parts.append((source, block))
            self._buffered += rows

    def full_batches(self) -> Iterator[tuple[Columns, Delivered]]:
        """Every whole batch the buffer holds, with the rows each source contributed."""
        while self._buffered >= self._batch_size:
            yield self._cut(self._batch_size)

    def remainder(self) -> tuple[Columns | None, Delivered]:
        """The partial batch left (None when empty or dropped); dropped rows count as delivered."""
        if not self._buffered:
            return None, []
        batch, delivered = self._cut(self._buffered)
        return (None if self._drop_remainder else batch), delivered

    def _cut(self, rows: int) -> tuple[Columns, Delivered]:
        pieces: list[Columns] = []
        delivered: Delivered = []
        while rows:
            source, block = self._parts[0]
            take = min(rows, _rows(block))
            if take == _rows(block):
                self._parts.popleft()
                pieces.append(block)
            else:
                pieces.append({name: values[:take] for name, values in block.items()})
                self._parts[0] = (source, {name: values[take:] for name, values in block.items()})
            if delivered and delivered[-1][0] == source:
                delivered[-1] = (source, delivered[-1][1] + take)
            else:
                delivered.append((source, take))
            rows -= take
            self._buffered -= take
        if len(pieces) == 1:
            return pieces[0], delivered
        return {name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}, delivered
