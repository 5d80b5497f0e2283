"""What a job's splits are and the order rows come out of them (pure; shared by workers and tests).

A split is one block of the snapshot. The dispatcher only counts splits; a
worker turns ``(snapshot, seed, iteration, split)`` into rows itself, so no row
and no plan travels through the dispatcher and every worker agrees.
"""

from __future__ import annotations

import hashlib

import numpy as np

from reader.order import seeded_generator
from reader.plan import Piece, all_blocks

_SPLIT_ORDER, _ROWS_IN_SPLIT, _WORKER = 11, 12, 13


def job_splits(block_rows: list[list[int]], seed: int, iteration: int) -> list[Piece]:
    """Every block once, in the job's seeded order."""
    blocks = all_blocks(block_rows)
    return [blocks[i] for i in seeded_generator(seed, iteration, _SPLIT_ORDER).permutation(len(blocks))]


def rows_in_split(rows: int, seed: int, iteration: int, split: int) -> np.ndarray:
    """The order of a split's rows (a consumer resuming at offset k skips the first k of these)."""
    return seeded_generator(seed, iteration, split, _ROWS_IN_SPLIT).permutation(rows)


def worker_seed(seed: int, worker_address: str) -> int:
    """parallel_epochs: each worker shuffles the whole snapshot its own way."""
    digest = int.from_bytes(hashlib.sha256(worker_address.encode()).digest()[:8], "little")
    return int(seeded_generator(seed, digest % (2**63), _WORKER).integers(0, 2**63 - 1))


def needed_rows(rows: int, seed: int, iteration: int, split: int, offset: int) -> np.ndarray:
    """Where each still-needed row of a split is in what a worker sends for it, in delivery order.

    A worker sends the rows ``order[offset:]`` of the split's seeded order in
    stored order (the whole block, untouched, when ``offset`` is 0); gathering
    the received rows at these positions yields them in the seeded order.
    """
    remaining = rows_in_split(rows, seed, iteration, split)[offset:]
    return remaining if offset == 0 else np.searchsorted(np.sort(remaining), remaining)
