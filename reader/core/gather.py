"""Gathering a step's rows out of the windows a ``WindowLoader`` loads into one batch, each row written once.

A step's rows are a range of the epoch stream; they lie in one or more
consecutive windows, in each at the positions its row order gives (stored
order when unshuffled). Each window writes its rows into the batch itself
(``reader.core.batch``); unshuffled rows within one window are handed out as
views of it, not copied.
"""

from __future__ import annotations

import bisect
import functools
import time

from reader.core.allocator import BatchAllocator, Columns
from reader.core.batch import BatchBuilder
from reader.core.stats import SAMPLE_EVERY, ReaderClock
from reader.core.window_loader import WindowLoader


class Gatherer:
    """Gathers stream rows into batches out of the windows a ``WindowLoader`` loads, across epochs."""

    def __init__(
        self,
        loader: WindowLoader,
        empty_batch: Columns,
        pool,
        threads: int,
        allocate: BatchAllocator,
        clock: ReaderClock,
    ) -> None:
        """``clock`` counts the gathers' time, less what they waited for windows to load, as ``gather`` (sampled)."""
        self._loader = loader
        self._timed = clock.steps.gather
        self._empty_batch = empty_batch
        self._new_batch = functools.partial(
            BatchBuilder, empty_batch=empty_batch, pool=pool, threads=threads, allocate=allocate
        )

    def gather(self, epoch: int, start: int, stop: int) -> Columns:
        """Stream rows ``[start, stop)`` of ``epoch``, written once into a new batch (or, unshuffled
        rows within one window, views of it)."""
        stage = self._timed
        stage.steps += 1
        if (stage.steps - 1) % SAMPLE_EVERY:
            return self._gather(epoch, start, stop)
        started, waited = time.perf_counter(), self._loader.waited
        batch = self._gather(epoch, start, stop)
        stage.seconds += time.perf_counter() - started - (self._loader.waited - waited)
        stage.sampled += 1
        return batch

    def _gather(self, epoch: int, start: int, stop: int) -> Columns:
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
