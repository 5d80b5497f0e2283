"""Reading a remainder epoch: what an elastic restore left of an epoch, as this pipeline's steps.

A remainder (``reader.core.elastic``) is segments of the epoch streams of the pipelines the epoch
started on; this pipeline reads its share of it (``elastic.remainder_cut``) segment after segment.
A segment is a range of one base pipeline's ``EpochOrder`` for that epoch, gathered by a
``WindowLoader`` and ``Gatherer`` of its own over that order into fresh window memory (a remainder is
read once, so the pipeline's window cache is left to its normal epochs); a step that spans two
segments is copied into one batch. The windows a loader loads ahead past a segment's end are thrown
away: a cost paid once per restore.
"""

from __future__ import annotations

from collections.abc import Iterator

from reader.core.allocator import Columns
from reader.core.elastic import Remainder, remainder_cut
from reader.core.gather import Gatherer
from reader.core.plan import Position
from reader.core.stats import ReaderClock
from reader.core.window_cache import CachedWindows
from reader.core.window_loader import WindowLoader


class RemainderReader:
    """Reads ``pipeline``'s share of ``remainder`` on the pass's pools, one base stream at a time."""

    def __init__(self, pipeline, remainder: Remainder, pool, io_pool, clock: ReaderClock) -> None:
        """``pipeline``: the ``ReadPipeline`` restored (its topology, seed, source and settings)."""
        self._pipeline = pipeline
        self._remainder = remainder
        self._pools = pool, io_pool, clock
        self._base_pieces = remainder.base.pieces(pipeline.snapshot.block_rows)
        self._open: tuple[int, WindowLoader, Gatherer] | None = None  # the base stream being read

    def steps(self, first_step: int) -> Iterator[tuple[Position, list[Columns]]]:
        """Per-replica batches of the remainder epoch from ``first_step``, each with the position after it."""
        pipeline, epoch = self._pipeline, self._remainder.epoch
        cut = remainder_cut(pipeline.topology, self._remainder.segments)
        me = pipeline.options.context.input_pipeline_id
        steps = cut.plan(me).steps
        try:
            for step in range(first_step, steps):
                segments = cut.step_segments(me, step)
                parts = [self._gather(base, start, stop) for base, start, stop in segments]
                rows = sum(stop - start for _, start, stop in segments)
                yield Position(epoch, step).after(steps), pipeline.per_replica(self._joined(parts, rows), rows)
        finally:
            self._close()

    def _gather(self, base: int, start: int, stop: int) -> Columns:
        if self._open is None or self._open[0] != base:
            self._close()
            pipeline = self._pipeline
            base_order = pipeline.epoch_order(self._base_pieces[base], self._remainder.base.window_rows)
            # Stops at the remainder's epoch: nothing of the next one is loaded or read ahead.
            self._open = (base, *pipeline.reading(base_order, CachedWindows(None), self._remainder.epoch, *self._pools))
        return self._open[2].gather(self._remainder.epoch, start, stop)

    def _joined(self, parts: list[Columns], rows: int) -> Columns:
        """One batch of the parts of a step (the part itself when there is one)."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return dict(self._pipeline.empty_batch)
        batch, filled = self._pipeline.allocate_batch(rows, self._pipeline.empty_batch), 0
        for part in parts:
            count = len(next(iter(part.values())))
            for name, values in part.items():
                batch[name][filled : filled + count] = values
            filled += count
        return batch

    def _close(self) -> None:
        if self._open is not None:
            self._open[1].end_pass(finished=False)
            self._open = None
