"""How many rows of each source a mixture's epoch and each of its batches take. Pure logic over counts.

A mixture of sources with weights takes, each epoch, the largest-remainder share of its
``epoch_rows`` from every source (``largest_remainder``), and spreads each source's share over the
epoch's global batches so that every batch carries each source within one row of weight x batch size
(``apportion``: a rounding of the ideal batch-by-source table that keeps every batch's size and every
source's epoch total exact). A source is read pass after pass, each epoch continuing where the last
one stopped (``MixturePlan.source_start``), so none of its rows repeats before all were delivered.

Everything is a function of (source rows, weights, epoch rows, batch size), the same on every machine
and for any number of pipelines: they slice one global stream of batches (``reader.core.mixture``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

import numpy as np

from schemas.errors import UsageError


def largest_remainder(total: int, weights: Sequence[float]) -> np.ndarray:
    """``total`` split by ``weights``: each gets the floor of its share, and the rows left go one each to the
    largest fractional parts (ties to the first)."""
    shares = np.asarray(weights, dtype=np.float64) / float(sum(weights)) * total
    counts = np.floor(shares).astype(np.int64)
    left = total - int(counts.sum())
    if left:
        order = np.lexsort((np.arange(len(shares)), -(shares - counts)))
        counts[order[:left]] += 1
    return counts


def apportion(totals: Sequence[int], sizes: Sequence[int], shares: Sequence[float]) -> np.ndarray:
    """A table of ``len(sizes)`` batches by ``len(totals)`` sources whose row ``r`` sums to ``sizes[r]``, whose
    column ``s`` sums to ``totals[s]``, and whose every cell is the floor or the ceiling of
    ``shares[s] * sizes[r]`` (``shares`` sum to 1, ``sum(sizes) == sum(totals)``; every size but the last one
    is the same: an epoch's whole batches and its partial one).

    Every cell starts at its floor; what each source still needs are its *extras*, one row each in
    batches where its share is fractional. The partial batch picks its extras first, for the sources
    the whole batches cannot serve enough, then for those that need the most. The whole batches then
    share the rest by McNaughton's wrap-around rule (each source's extras on consecutive slots of a
    cycle over the batches, so no batch gets two of one source and each gets the same count), the
    batches visited in a golden-ratio stride so that a source's extras are spread over the epoch, not
    bunched at its start. A table that cannot be made (never, for integer sums) is a bug, raised as such.
    """
    totals_arr = np.asarray(totals, dtype=np.int64)
    shares_arr = np.asarray(shares, dtype=np.float64)
    sizes_arr = np.asarray(sizes, dtype=np.int64)
    whole, size = len(sizes_arr), (int(sizes_arr[0]) if len(sizes_arr) else 0)
    tail = None
    if whole and int(sizes_arr[-1]) != size:
        whole, tail = whole - 1, int(sizes_arr[-1])
    if (sizes_arr[:whole] != size).any():
        raise ValueError(f"apportion: batches of more than one size before the last: {list(sizes)}")
    table = np.zeros((len(sizes_arr), len(totals_arr)), dtype=np.int32)
    full_floor, full_fractional = _floors(size * shares_arr)
    table[:whole] = full_floor
    extras = totals_arr - whole * full_floor
    if tail is not None:
        tail_floor, tail_fractional = _floors(tail * shares_arr)
        extras -= tail_floor
        capacity = whole * full_fractional  # extras the whole batches can give each source
        eligible = np.flatnonzero(tail_fractional & (extras >= 1))
        ranked = eligible[np.lexsort((eligible, -extras[eligible], -(extras - capacity)[eligible]))]
        picked = ranked[: tail - int(tail_floor.sum())]
        if len(picked) < tail - int(tail_floor.sum()):
            raise RuntimeError(f"apportion({list(totals)}, {list(sizes)}): the partial batch cannot be filled")
        table[-1] = tail_floor
        table[-1, picked] += 1
        extras[picked] -= 1
    if whole:
        if (extras < 0).any() or (extras > whole * full_fractional).any():
            raise RuntimeError(f"apportion({list(totals)}, {list(sizes)}): extras {extras.tolist()} do not fit")
        stride = _coprime_stride(whole)
        slots = np.arange(int(extras.sum()), dtype=np.int64)
        rows = (slots % whole) * stride % whole
        cells = rows * len(extras) + np.repeat(np.arange(len(extras)), extras)
        table[:whole] += np.bincount(cells, minlength=whole * len(extras)).reshape(whole, len(extras)).astype(np.int32)
    if not np.array_equal(table.sum(axis=0), totals_arr) or not np.array_equal(table.sum(axis=1), sizes_arr):
        raise RuntimeError(f"apportion({list(totals)}, {list(sizes)}): sums {table.sum(axis=0).tolist()}")
    return table


def _floors(ideal: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The floor of each ideal count, and whether it is fractional (a float product a hair off an integer is one)."""
    floors = np.floor(ideal + 1e-9).astype(np.int64)
    return floors, (ideal - floors) > 1e-9


def _coprime_stride(count: int) -> int:
    """A step near ``count`` / golden ratio sharing no factor with ``count``: ``k * step % count`` visits every
    index once, each next one far from the last."""
    stride = max(1, round(count * 0.6180339887))
    while math.gcd(stride, count) != 1:
        stride += 1
    return stride


def batch_sizes(epoch_rows: int, batch: int, drop_remainder: bool) -> list[int]:
    """The epoch's batches: whole ones of ``batch`` rows, and the partial last one unless it is dropped."""
    whole, left = divmod(epoch_rows, batch)
    return [batch] * whole + ([left] if left and not drop_remainder else [])


@dataclasses.dataclass(frozen=True)
class MixturePlan:
    """One epoch's rows per source and per batch, the same every epoch.

    ``batch`` is the batch the plan is stratified on: the global batch when pipelines slice one stream,
    a pipeline's batch when each reads all of it (``shard_policy=OFF``). With ``drop_remainder`` an
    epoch is ``epoch_rows`` rounded down to whole batches, and the shares are of that.
    """

    source_rows: tuple[int, ...]
    weights: tuple[float, ...]
    epoch_rows: int
    batch: int
    drop_remainder: bool

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise UsageError(f"a mixture needs a batch of at least 1 row, got {self.batch}")

    @functools.cached_property
    def sizes(self) -> list[int]:
        return batch_sizes(self.epoch_rows, self.batch, self.drop_remainder)

    @property
    def delivered_rows(self) -> int:
        """Rows an epoch delivers (``epoch_rows``, less a dropped partial batch)."""
        return sum(self.sizes)

    @functools.cached_property
    def shares(self) -> np.ndarray:
        weights = np.asarray(self.weights, dtype=np.float64)
        return weights / weights.sum()

    @functools.cached_property
    def quotas(self) -> np.ndarray:
        """Rows each source gives an epoch: the largest-remainder share of the epoch's rows."""
        return largest_remainder(self.delivered_rows, self.weights)

    @functools.cached_property
    def batch_quotas(self) -> np.ndarray:
        """Batches x sources: the rows each batch takes of each source."""
        if not self.sizes:
            return np.zeros((0, len(self.weights)), dtype=np.int64)
        return apportion(self.quotas, self.sizes, self.shares)

    def window_quotas(self, batches_per_window: int) -> np.ndarray:
        """Windows x sources: the rows each window of ``batches_per_window`` consecutive batches takes of each source."""
        if not self.sizes:
            return np.zeros((0, len(self.weights)), dtype=np.int64)
        starts = np.arange(0, len(self.sizes), batches_per_window)
        return np.add.reduceat(self.batch_quotas.astype(np.int64), starts, axis=0)

    def source_start(self, source: int, epoch: int) -> int:
        """Where epoch ``epoch`` starts in source ``source``'s stream of passes (every epoch takes its quota)."""
        return epoch * int(self.quotas[source])
