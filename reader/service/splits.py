"""What a job's splits are and the order rows come out of them (pure; shared by workers and tests).

A job visits every block once, in a seeded order; a split is ``BLOCKS_PER_SPLIT``
consecutive blocks of that order, so each lease, fetch and acknowledgement
moves several megabytes (one block per split spent more on round trips than on
rows). Within a block rows come out in a seeded order of their own. The
dispatcher only counts splits; a worker turns ``(snapshot, seed, iteration,
split)`` into rows itself, so no row and no plan travels through the
dispatcher and every worker agrees.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

from reader.core.order import seeded_generator
from reader.core.plan import Piece

_BLOCK_ORDER, _ROWS_IN_BLOCK, _WORKER = 11, 12, 13
#: Blocks per split: about 32 MiB at the default 1 MiB blocks. Each split costs a stream and its share of a lease
#: round trip, so fewer, larger splits cost less CPU on both sides (docs/architecture.md §9.6); larger still would
#: balance the load between workers and consumers more coarsely.
BLOCKS_PER_SPLIT = 32


class SplitOrder(Protocol):
    """A job's splits in one epoch as a consumer counts them: a snapshot's ``JobOrder``, a mixture's
    ``mixture_jobs.MixtureSplits``."""

    def split_count(self) -> int: ...

    def split_rows(self, split: int) -> int: ...


class JobOrder(Sequence[Piece]):
    """A job's blocks in its seeded order, looked up as needed rather than listed.

    Every epoch of every consumer and every worker orders the snapshot's
    blocks anew (``job_blocks``). Listing them cost about 0.35 s at a million
    blocks (a 1 TB snapshot of 1 MiB blocks) before an epoch's first batch;
    the order itself, one NumPy permutation, about 0.02 s. A split needs only
    its own ``BLOCKS_PER_SPLIT`` blocks (``order[a:b]`` lists just those).
    """

    def __init__(self, blocks: Sequence[Piece], order: np.ndarray) -> None:
        self._blocks = blocks
        self._order = order

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self._blocks[i] for i in self._order[index].tolist()]
        return self._blocks[self._order[index]]

    def __iter__(self) -> Iterator[Piece]:
        return (self._blocks[i] for i in self._order.tolist())

    def split_count(self) -> int:
        return split_count(self)

    def split_rows(self, split: int) -> int:
        """Rows of ``split`` (what a consumer counts of a split; a mixture job's is ``mixture_jobs.MixtureSplits``)."""
        return split_rows(self, split)


def job_blocks(blocks: Sequence[Piece], seed: int, iteration: int) -> JobOrder:
    """Every block once (``blocks``: the snapshot's ``plan.all_blocks``), in the job's seeded order."""
    return JobOrder(blocks, seeded_generator(seed, iteration, _BLOCK_ORDER).permutation(len(blocks)))


def all_split_rows(block_rows: Sequence[Sequence[int]], seed: int, iteration: int) -> np.ndarray:
    """Rows of every split of the job, in split order, from the snapshot's ``block_rows``: a restore weighs them
    all (``reader.service.rollback``). NumPy over the row counts, without listing the blocks
    (``plan.all_blocks``): at a million blocks the job's order (one permutation) is most of its cost."""
    counts = [np.asarray(rows, np.int64) for rows in block_rows]
    rows = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    rows = rows[rows > 0]  # the blocks ``plan.all_blocks`` lists
    rows = rows[seeded_generator(seed, iteration, _BLOCK_ORDER).permutation(len(rows))]  # as ``job_blocks``
    return np.add.reduceat(rows, np.arange(0, len(rows), BLOCKS_PER_SPLIT)) if len(rows) else rows


def split_blocks(blocks: Sequence[Piece], split: int) -> list[Piece]:
    """The blocks of ``split``, given the job's ``job_blocks``."""
    return list(blocks[split * BLOCKS_PER_SPLIT : (split + 1) * BLOCKS_PER_SPLIT])


def split_count(blocks: Sequence[Piece]) -> int:
    """How many splits a job over ``blocks`` (its ``job_blocks``, or ``all_blocks``) has."""
    return math.ceil(len(blocks) / BLOCKS_PER_SPLIT)


def rows_in_block(rows: int, seed: int, iteration: int, position: int) -> np.ndarray:
    """The order of the rows of the block at ``position`` in the job's block order."""
    return seeded_generator(seed, iteration, position, _ROWS_IN_BLOCK).permutation(rows)


def worker_seed(seed: int, worker_address: str) -> int:
    """parallel_epochs: each worker shuffles the whole snapshot its own way.

    The consumer derives it and sends it in the ticket, so the worker streams
    and the consumer orders by the same seed whatever address the worker
    believes it has.
    """
    digest = int.from_bytes(hashlib.sha256(worker_address.encode()).digest()[:8], "little")
    return int(seeded_generator(seed, digest % (2**63), _WORKER).integers(0, 2**63 - 1))


@dataclasses.dataclass(frozen=True)
class SplitPart:
    """A block of a stream (a split, or a parallel_epochs worker's epoch) and the rows of it still to deliver.

    ``order``: those rows in delivery order, as indices into the whole block.
    """

    piece: Piece
    order: np.ndarray


def split_rows(blocks: Sequence[Piece], split: int) -> int:
    """How many rows ``split`` (of the job's ``job_blocks``) holds."""
    return sum(piece.rows for piece in split_blocks(blocks, split))


def remaining_parts(blocks: Sequence[Piece], seed: int, iteration: int, split: int, offset: int) -> Iterator[SplitPart]:
    """The parts of ``split`` (of the job's ``job_blocks``) left after its first ``offset`` rows were delivered.

    Lazy, like ``stream_parts``: a block's row order costs about 0.1 ms to
    draw, and a split's first block should not wait for the other seven.
    """
    return stream_parts(split_blocks(blocks, split), split * BLOCKS_PER_SPLIT, seed, iteration, offset)


def stream_parts(
    pieces: list[Piece], first_position: int, seed: int, iteration: int, offset: int
) -> Iterator[SplitPart]:
    """The parts of a stream of blocks left after its first ``offset`` rows were delivered, lazily.

    ``pieces`` sit at positions ``first_position``, ... of the job's block order
    (a split's blocks, or a parallel_epochs worker's whole order): the position
    seeds each block's row order, so a worker and a consumer agree on it.
    """
    for position, piece in enumerate(pieces, first_position):
        if offset >= piece.rows:
            offset -= piece.rows
            continue
        yield SplitPart(piece, rows_in_block(piece.rows, seed, iteration, position)[offset:])
        offset = 0
