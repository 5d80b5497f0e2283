"""The reader core: plan + order + blocks composed into per-replica batches.

``ReadPipeline`` is everything fixed for a dataset (the plan for every epoch);
``ReadPipeline.steps(position)`` yields ``(next_position, per-replica batches)``
from any position, which is all a resumable iterator, the TensorFlow adapter
and the service workers need. A pass runs these stages, each feeding the next:

- ``reader.core.window_loader``: loads the windows of the epoch stream ahead of
  use and reads further ones ahead (blocks read on an I/O pool sized for
  requests in flight, decoded on a pool sized for the cores), into the window
  memory the pass took from ``reader.core.window_cache`` and puts back at its end.
  It is given what it needs, once per pass: the ``BlockReader``, the pass's
  ``EpochOrder`` (pieces, window size, seed) and the ``LoadSettings``, never
  the pipeline itself;
- ``reader.core.gather``: gathers each step's rows out of those windows into a batch;
- ``_epochs`` here: cuts the step's batch into per-replica batches.

A pass restored on another topology first reads what was left of its epoch
(``reader.core.remainder``, planned by ``reader.core.elastic``), then normal epochs.
"""

from __future__ import annotations

import concurrent.futures
import copy
import math
import os
import secrets
import warnings
from collections.abc import Iterator, Sequence

from reader.core import allocator, block_io, elastic, order
from reader.core.allocator import Columns
from reader.core.blocks import BlockReader
from reader.core.elastic import Remainder, Streams, Topology
from reader.core.gather import Gatherer
from reader.core.options import AUTO_WINDOW_BYTES, LARGE_ROW_BYTES, ReaderOptions, auto_reader_threads
from reader.core.plan import Piece, Position, ShardPolicy, StepPlan, assigned_pieces, plan_steps, replica_ranges
from reader.core.remainder import RemainderReader
from reader.core.stats import ReaderClock, TimedPool
from reader.core.union import Readable
from reader.core.window_cache import CachedWindows, WindowCache
from reader.core.window_loader import LoadSettings, WindowLoader
from schemas.errors import UsageError

#: Steps this small cross from the prefetch thread to the consumer several at a time (``step_groups``): each
#: hand-over wakes the consumer and moves the GIL between the threads, 60 us on a loaded 2-core machine, as
#: long as gathering a step of 1,024 rows of 100 bytes. Groups stay under this many bytes.
GROUP_BYTES = 1 << 20
#: ... and this many steps.
MAX_GROUP_STEPS = 8


def row_bytes(snapshot: Readable, names: list[str]) -> float:
    """Bytes a row of ``names`` takes in memory or as stored, whichever is more: what AUTO windows are sized by."""
    spec = snapshot.element_spec
    fixed = sum(spec[name].dtype.itemsize * math.prod(spec[name].shape[1:]) for name in names if spec[name].fixed_width)
    stored = snapshot.num_bytes / max(1, snapshot.num_rows)
    return max(fixed, stored, 1.0)


def window_rows(options: ReaderOptions, row_bytes: float) -> int:
    """Rows of one shuffle window: ``shuffle_buffer_size``, or AUTO's about 32 MiB of rows of ``row_bytes``
    (a mixture's windows on the reader service too: ``reader.service.mixture_jobs``)."""
    return options.shuffle_buffer_size or max(1, int(AUTO_WINDOW_BYTES // row_bytes))


class PassPools:
    """The thread pools a pipeline's passes read on, kept from pass to pass: blocks read on the I/O pool
    (sized for requests in flight), decoded and gathered on the block pool (sized for the cores).

    Pools of their own for each pass started 30-odd threads at every ``for batch in dataset`` and shut
    them down at its end: the usual loop over epochs ran 5-10% slower than with these (medians of 5 and
    7 alternating runs, 3 KB rows, a loop like ``bench.reader_bench``'s), and a pass that ended had to
    wait for the reads of the loads it kept for the next. Made at the first pass in each process: a
    forked process (a DataLoader worker) has none of its parent's threads, so it makes its own. Idle
    threads end when the pipeline is collected (an executor's workers exit once it is) or at exit.
    """

    def __init__(self, io_threads: int, block_threads: int) -> None:
        self._threads = io_threads, block_threads
        self._made: tuple[int, concurrent.futures.Executor, concurrent.futures.Executor] | None = None

    def get(self) -> tuple[concurrent.futures.Executor, concurrent.futures.Executor]:
        """The I/O pool and the block pool of this process."""
        made = self._made
        if made is None or made[0] != os.getpid():
            io_threads, block_threads = self._threads
            made = (
                os.getpid(),
                concurrent.futures.ThreadPoolExecutor(io_threads, "snapfeed-io"),
                concurrent.futures.ThreadPoolExecutor(block_threads, "snapfeed-block"),
            )
            self._made = made  # two passes starting at once may each make a set: the one not kept is collected
        return made[1], made[2]


class ReadPipeline:
    """One input pipeline over one snapshot (or a union of several, read as one), with its options resolved."""

    def __init__(
        self, snapshot: Readable, options: ReaderOptions, allocate_batch: allocator.BatchAllocator = allocator.new_batch
    ) -> None:
        """``allocate_batch``: where gathered batches' memory comes from (``reader.core.allocator``)."""
        wanted = snapshot.readable_columns(options.columns)
        context, policy = options.context, options.shard_policy
        if policy is ShardPolicy.DATA and context.num_input_pipelines > 1 and options.shuffle and options.seed is None:
            raise UsageError(
                "shard_policy=DATA with shuffle=True needs the same seed on every input pipeline: pass seed=<int>"
            )
        self.snapshot = snapshot
        self.options = options
        self.allocate_batch = allocate_batch
        self.columns = wanted
        self.seed = options.seed if options.seed is not None else secrets.randbits(63)
        self.pieces, self.step_plan = self._plan(snapshot, options)
        if self.step_plan.steps == 0 and options.drop_remainder and snapshot.num_rows:
            rows = sum(p.rows for p in self.pieces)
            warnings.warn(
                f"{snapshot.path}: global_batch_size={options.global_batch_size} with drop_remainder=True leaves "
                f"0 steps per epoch (this input pipeline has {rows} rows); lower the batch size or pass "
                f"drop_remainder=False",
                stacklevel=5,
            )
        self.row_bytes = row_bytes(snapshot, wanted)
        self.window_rows = window_rows(options, self.row_bytes)
        self.block_threads = options.read.num_reader_threads or auto_reader_threads(self.row_bytes)
        self.replicas = context.replicas_per_pipeline
        self.source = BlockReader(
            snapshot,
            wanted,
            verify_checksums=options.read.verify_checksums,
            cache=options.cache.open(),
            keep_fetched_bytes=options.read.read_ahead_bytes // 4,  # about the fetches of a window
        )
        self.load_settings = LoadSettings(
            large_rows=self.row_bytes >= LARGE_ROW_BYTES,
            # Merged reads small enough that the read-ahead keeps every I/O thread busy, up to the store's sweet spot.
            max_range_bytes=max(
                1, min(block_io.COALESCE_BYTES, options.read.read_ahead_bytes // options.read.num_io_threads)
            ),
            read_ahead_bytes=options.read.read_ahead_bytes,
            windows_ahead=options.read.reader_buffer_size,
            open_threads=options.read.num_io_threads,
        )
        self.empty_batch = {name: snapshot.element_spec[name].empty(0) for name in wanted}
        self._window_cache = WindowCache(self._ring_size(), self._largest_window())  # shared with with_seed() clones
        self._pools = PassPools(options.read.num_io_threads, self.block_threads)  # and so are these
        self._own_order: order.EpochOrder | None = None  # epoch_order(), kept (a with_seed clone makes its own)

    def _plan(self, snapshot: Readable, options: ReaderOptions) -> tuple[list[Piece], StepPlan]:
        """This pipeline's pieces of each epoch and how its stream is cut into steps (``reader.core.plan``)."""
        context = options.context
        all_pieces = assigned_pieces(snapshot.block_rows, options.shard_policy, context)
        step_plan = plan_steps(
            [sum(p.rows for p in pieces) for pieces in all_pieces],
            options.global_batch_size,
            options.shard_policy,
            context,
            drop_remainder=options.drop_remainder,
        )
        return all_pieces[context.input_pipeline_id], step_plan

    def resume(
        self, position: Position, saved_by: Topology, remainder: Remainder | None
    ) -> tuple[Position, Remainder | None]:
        """Where a state saved at ``position`` by pipelines cut as ``saved_by`` resumes here (``elastic.resume``)."""
        return elastic.resume(position, saved_by, remainder, self.topology, self.snapshot.block_rows)

    def steps_left(self, state: dict) -> int:
        """Steps this pipeline still takes in the epoch of its own ``state`` (``elastic.steps_left``)."""
        return elastic.steps_left(state, self.snapshot.block_rows)

    def _ring_size(self) -> int:
        """One buffer per window in flight (current + ahead + the one just left), reused pass after pass.

        Shuffled batches are gathered copies, so window memory can be reused;
        unshuffled batches are views of their window, which must stay theirs (no ring).
        """
        return self.options.read.reader_buffer_size + 2 if self.options.shuffle else 0

    def _largest_window(self) -> int:
        # A window closes at the piece that brings it to window_rows, so none is larger than this.
        return self.window_rows - 1 + max((piece.rows for piece in self.pieces), default=1)

    @property
    def group_steps(self) -> int:
        """Steps handed to the consumer together (``step_groups``): as many as fit ``GROUP_BYTES``, one for
        batches gathered into memory the pipeline was lent (a DataLoader worker's shared-memory slots are
        counted for ``prefetch`` steps, one at a time)."""
        if self.allocate_batch is not allocator.new_batch:
            return 1
        step_bytes = self.options.global_batch_size / self.options.context.num_input_pipelines * self.row_bytes
        return max(1, min(MAX_GROUP_STEPS, int(GROUP_BYTES // step_bytes)))

    @property
    def gather_steps(self) -> int:
        """Consecutive steps gathered into one batch and handed out as its slices: ``group_steps`` when
        shuffled (unshuffled steps within a window are views of it, not gathered copies).

        A small step's own work around its ``take``s (finding its windows, a ``BatchBuilder``, the batch's
        arrays) is a large part of its gather; steps gathered together pay it once (docs/architecture.md §9.3).
        """
        return self.group_steps if self.options.shuffle else 1

    def step_groups(
        self,
        start: Position,
        stop_epoch: int | None,
        clock: ReaderClock | None = None,
        remainder: Remainder | None = None,
    ) -> Iterator[list[tuple[Position, list[Columns]]]]:
        """``steps`` in lists of ``group_steps`` (the pass's first step alone: it is waited for)."""
        group: list[tuple[Position, list[Columns]]] = []
        size = 1
        for step in self.steps(start, stop_epoch, clock, remainder):
            group.append(step)
            if len(group) == size:
                yield group
                group, size = [], self.group_steps
        if group:
            yield group

    def with_seed(self, seed: int) -> ReadPipeline:
        """The same pipeline with another seed (a restored iterator keeps the seed it was saved with)."""
        if seed == self.seed:
            return self
        clone = copy.copy(self)
        clone.seed = seed
        return clone

    @property
    def steps_per_epoch(self) -> int:
        return self.step_plan.steps

    def stop_epoch(self, first_epoch: int) -> int | None:
        epochs = self.options.num_epochs
        return None if epochs is None else first_epoch + epochs

    @property
    def topology(self) -> Topology:
        """How this pipeline's epochs are cut into steps (what a state saved on other pipelines is resumed by)."""
        o = self.options
        streams = Streams(o.shard_policy, o.context.num_input_pipelines, self.window_rows)
        return Topology(streams, o.global_batch_size, o.drop_remainder)

    def epoch_order(self, pieces: Sequence[Piece] | None = None, window_rows: int | None = None) -> order.EpochOrder:
        """The order of this pipeline's pieces with its seed, epoch by epoch (or of other ``pieces`` and
        ``window_rows``: a base stream of a remainder). The pipeline's own is kept from pass to pass, with
        the windows it computed."""
        own = pieces is None and window_rows is None
        if own and self._own_order is not None and self._own_order.seed == self.seed:
            return self._own_order
        epoch_order = order.EpochOrder(
            tuple(self.pieces if pieces is None else pieces),
            window_rows or self.window_rows,
            self.seed,
            shuffle=self.options.shuffle,
            reshuffle_each_epoch=self.options.reshuffle_each_epoch,
        )
        if own:
            self._own_order = epoch_order
        return epoch_order

    def steps(
        self,
        start: Position,
        stop_epoch: int | None,
        clock: ReaderClock | None = None,
        remainder: Remainder | None = None,
    ) -> Iterator[tuple[Position, list[Columns]]]:
        """Per-replica batches from ``start`` until ``stop_epoch`` (None: forever); the time of each stage's
        tasks counted in ``clock`` (``iterator.stats()``), or in one nobody reads. ``remainder``: what an
        elastic restore left of ``start``'s epoch, read instead of that epoch."""
        clock = clock or ReaderClock()
        allocator.keep_freed_batches()
        io_pool, pool = self._pools.get()
        in_pass = stop_epoch is None or start.epoch < stop_epoch
        if remainder is not None and remainder.epoch == start.epoch and in_pass:
            yield from RemainderReader(self, remainder, pool, io_pool, clock).steps(start.step)
            start = Position(start.epoch + 1, 0)
        cached_windows = self._window_cache.take(self.seed, start)
        loader, gatherer = self.reading(self.epoch_order(), cached_windows, stop_epoch, pool, io_pool, clock)
        finished = False
        try:
            yield from self._epochs(gatherer, start, stop_epoch)
            finished = True
        finally:
            # Loads it cancels are waited for there (they write into the ring); loads it keeps for the
            # next pass are still running on the pools, and that pass waits for them.
            self._window_cache.put_back(loader.end_pass(finished=finished))

    def reading(
        self,
        epoch_order: order.EpochOrder,
        cached: CachedWindows,
        stop_epoch: int | None,
        pool: concurrent.futures.Executor,
        io_pool: concurrent.futures.Executor,
        clock: ReaderClock,
    ) -> tuple[WindowLoader, Gatherer]:
        """A loader of ``epoch_order``'s windows into ``cached`` and a gatherer of steps out of them, on a
        pass's pools."""
        loader = WindowLoader(
            self.source,
            epoch_order,
            self.load_settings,
            TimedPool(pool, clock, "decode"),
            TimedPool(io_pool, clock, "storage_reads"),
            cached,
            stop_epoch,
        )
        gatherer = Gatherer(
            loader,
            self.empty_batch,
            TimedPool(pool, clock, "gather"),
            self.block_threads,
            self.allocate_batch,
            clock,
        )
        return loader, gatherer

    def per_replica(self, batch: Columns, rows: int) -> list[Columns]:
        """A step's ``rows`` rows split across this pipeline's replicas in order (one replica: the batch itself)."""
        if self.replicas == 1:
            return [batch]
        return [
            {name: values[lo:hi] for name, values in batch.items()} for lo, hi in replica_ranges(rows, self.replicas)
        ]

    def _epochs(
        self, gatherer: Gatherer, start: Position, stop_epoch: int | None
    ) -> Iterator[tuple[Position, list[Columns]]]:
        epoch, first_step = start.epoch, start.step
        gather_steps = self.gather_steps
        first_pass_step = True  # gathered alone: the first batch is waited for
        while stop_epoch is None or epoch < stop_epoch:
            if self.steps_per_epoch == 0 and stop_epoch is None:
                raise UsageError(
                    f"{self.snapshot.path} yields no step per epoch ({self.snapshot.num_rows} rows, "
                    f"global_batch_size={self.options.global_batch_size}, drop_remainder=True); "
                    f"repeating forever would never yield"
                )
            step = first_step
            while step < self.steps_per_epoch:
                ranges = self._gathered_together(step, 1 if first_pass_step else gather_steps)
                first_pass_step = False
                offset = ranges[0][0]
                batch = gatherer.gather(epoch, offset, ranges[-1][1])
                for start_row, stop_row in ranges:
                    if len(ranges) > 1:
                        batch_rows = slice(start_row - offset, stop_row - offset)
                        step_batch = {name: values[batch_rows] for name, values in batch.items()}
                    else:
                        step_batch = batch
                    yield (
                        Position(epoch, step).after(self.steps_per_epoch),
                        self.per_replica(step_batch, stop_row - start_row),
                    )
                    step += 1
            epoch, first_step = epoch + 1, 0

    def _gathered_together(self, step: int, steps: int) -> list[tuple[int, int]]:
        """The stream rows of ``step`` and of the steps gathered with it (up to ``steps`` in all, in one epoch,
        each starting where the last ends), in order."""
        ranges = [self.step_plan.step_range(step)]
        for later in range(step + 1, min(step + steps, self.steps_per_epoch)):
            start_row, stop_row = self.step_plan.step_range(later)
            if start_row != ranges[-1][1]:
                break
            ranges.append((start_row, stop_row))
        return ranges
