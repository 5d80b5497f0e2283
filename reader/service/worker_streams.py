"""What a worker streams for a ticket: rows in delivery order, in record batches cut where the consumer cuts.

The worker does the shuffled gather, the one copy of the rows, so a consumer
hands a batch that arrived whole to training as it arrived: the consumer's
CPU is the training host's, and workers scale out. A block of a local,
uncompressed shard (a cache entry, or a bucket shard downloading into the
cache, included) is read straight into arrays the stream reuses
(``BlockReader.read_direct``): no decoding and no fresh memory per block,
about a third less of the worker's time per batch (docs/architecture.md §9.6). Other blocks
(compressed, in a bucket) are decoded.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterable, Iterator

import numpy as np
import pyarrow as pa

from reader.core.allocator import Columns
from reader.core.blocks import BlockReader
from reader.core.mixture import MixtureWindow
from reader.core.plan import Piece
from reader.core.snapshot import TensorSpec
from reader.service.delivery import DeliveryBatcher
from reader.service.splits import SplitPart
from schemas import columns


def in_delivery_order(
    source: BlockReader,
    spec: dict[str, TensorSpec],
    parts: Iterable[SplitPart],
    schema: pa.Schema,
    batch_rows: int,
    head: int,
    read_bytes: Callable[[int], None],
) -> Iterator[pa.RecordBatch]:
    """The parts' rows in delivery order, in record batches of ``batch_rows`` (the first of ``head`` when given).

    ``spec``: the snapshot's ``element_spec``; ``schema``: the stream's, with the columns ``source`` reads;
    ``read_bytes(n)``: told the bytes of each block read from storage (the worker's metrics).
    """
    buffers = _BlockBuffers({name: spec[name] for name in schema.names})

    def blocks() -> Iterator[tuple[Hashable, Columns, np.ndarray]]:
        for part in parts:
            key, block = buffers.read(source, part.piece, read_bytes)
            yield key, block, part.order

    return _cut(blocks(), schema, batch_rows, head, buffers.keep_only)


def windows_in_delivery_order(
    source: BlockReader,
    windows: Iterable[tuple[MixtureWindow, int]],
    schema: pa.Schema,
    batch_rows: int,
    head: int,
    read_bytes: Callable[[int], None],
) -> Iterator[pa.RecordBatch]:
    """A mixture job's windows (``reader.service.mixture_jobs``), each after the rows of it already delivered, in
    its row order and record batches as ``in_delivery_order``'s.

    A window's row order mixes rows of all its pieces (each batch takes its quota of every source at random
    among the window's rows of that source), so its pieces are loaded together, source after source, before
    its first row is sent: a stream holds one window (about 32 MiB) at a time.
    """

    def blocks() -> Iterator[tuple[Hashable, Columns, np.ndarray]]:
        for key, (window, offset) in enumerate(windows):
            pieces = [source.read(piece) for piece in window.pieces]
            read_bytes(source.ahead_bytes(list(window.pieces)))
            loaded = {name: np.concatenate([piece[name] for piece in pieces]) for name in schema.names}
            yield key, loaded, window.row_order()[offset:]

    return _cut(blocks(), schema, batch_rows, head, lambda held: None)


def _cut(
    blocks: Iterable[tuple[Hashable, Columns, np.ndarray]],
    schema: pa.Schema,
    batch_rows: int,
    head: int,
    release: Callable[[set[Hashable]], None],
) -> Iterator[pa.RecordBatch]:
    """Rows of ``blocks`` (a key, the rows, the order to send them in) cut into record batches of ``batch_rows``
    (the first of ``head``); ``release(held)`` is told which blocks' rows are still to be sent after each block."""
    batcher = DeliveryBatcher(batch_rows, drop_remainder=False, head=head)
    for key, block, order in blocks:
        batcher.add(key, block, order)
        for batch, _ in batcher.full_batches():
            yield columns.numpy_to_record_batch(schema, batch)
        release(batcher.holding())
    batch, _ = batcher.remainder()
    if batch is not None:
        yield columns.numpy_to_record_batch(schema, batch)


class _BlockBuffers:
    """Arrays blocks are read into directly, each lent to one block until the batcher took all of its rows.

    A stream holds as many as the blocks one batch spans, plus one: every
    batch is a fresh gather out of them, so none is sent while reused.
    """

    def __init__(self, spec: dict[str, TensorSpec]) -> None:
        self._spec = spec
        self._free: list[tuple[int, Columns]] = []  # (capacity in rows, arrays)
        self._lent: dict[int, tuple[int, Columns]] = {}
        self._keys = itertools.count()

    def read(self, source: BlockReader, piece: Piece, read_bytes: Callable[[int], None]) -> tuple[Hashable, Columns]:
        """The piece's rows, and the key of the buffer they are in (None: decoded into memory of their own).

        ``read_bytes`` is told what was read: a direct read, the piece's rows of each column; else its whole block.
        """
        key = next(self._keys)
        block = source.read_direct(piece, lambda rows: self._lend(key, rows))
        if block is None:
            decoded = columns.batch_to_numpy(source.read_arrow(piece))
            read_bytes(source.ahead_bytes([piece]))
            return None, decoded
        read_bytes(sum(values.nbytes for values in block.values()))
        return key, block

    def _lend(self, key: int, rows: int) -> Columns:
        fitting = [i for i, (capacity, _) in enumerate(self._free) if capacity >= rows]
        if fitting:
            capacity, arrays = self._free.pop(fitting[0])
        else:
            capacity, arrays = rows, {name: spec.empty(rows) for name, spec in self._spec.items()}
        self._lent[key] = (capacity, arrays)
        return {name: values[:rows] for name, values in arrays.items()}

    def keep_only(self, held: set[Hashable]) -> None:
        """Takes back the buffers of blocks whose rows were all cut into batches."""
        for key in [key for key in self._lent if key not in held]:
            self._free.append(self._lent.pop(key))
