"""The reader core: plan + order + blocks composed into per-replica batches.

``ReadPipeline`` is everything fixed for a dataset (the plan for every epoch);
``ReadPipeline.steps(position)`` yields ``(next_position, per-replica batches)``
from any position, which is all a resumable iterator, the TensorFlow adapter
and the service workers need. Windows of the epoch stream are read ahead while
the current one is gathered into batches: their blocks are read on an I/O pool
sized for requests in flight and decoded on a pool sized for the cores.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import copy
import dataclasses
import functools
import math
import secrets
import threading
import warnings
from collections.abc import Iterable, Iterator

import numpy as np

from reader import allocator, block_io, direct_gather, order
from reader.block_io import Fetch
from reader.blocks import BlockSource, Columns, Loading, WindowBuffer
from reader.direct_gather import DirectWindow
from reader.gather import DecodedParts, take_rows
from reader.options import AUTO_WINDOW_BYTES, LARGE_ROW_BYTES, ReaderOptions
from reader.plan import ShardPolicy, StepPlan, assigned_pieces, plan_steps, replica_ranges
from reader.snapshot import Snapshot
from schemas.errors import UsageError

Window = Columns | DecodedParts | DirectWindow


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    """The next step to deliver: step ``step`` of epoch ``epoch``."""

    epoch: int
    step: int


def _row_bytes(snapshot: Snapshot, names: list[str]) -> float:
    spec = snapshot.element_spec
    fixed = sum(spec[name].dtype.itemsize * math.prod(spec[name].shape[1:]) for name in names if spec[name].fixed_width)
    stored = snapshot.metadata.num_bytes / max(1, snapshot.num_rows)
    return max(fixed, stored, 1.0)


#: A window being loaded: its reads, and its row order (None: stored order).
_WindowLoad = tuple[Loading, concurrent.futures.Future]


@dataclasses.dataclass
class _ReadAhead:
    """A window read ahead of its load: its fetched blocks, and the bytes of its direct blocks that
    the kernel was asked to read into the page cache (counted until the window is loaded)."""

    fetch: Fetch | None
    advised_bytes: int

    @property
    def held_bytes(self) -> int:
        return self.advised_bytes + (self.fetch.held_bytes if self.fetch is not None else 0)

    def cancel(self) -> None:
        if self.fetch is not None:
            self.fetch.cancel()


@dataclasses.dataclass
class _Handover:
    """What a pass leaves the next one: its window buffers and the loads it started for it.

    A pass that ran to its stop epoch has already started loading the first
    windows of that epoch, where the next ``for batch in dataset`` starts, so
    the next pass's first batch does not wait for a window to be read.
    """

    ring: list[WindowBuffer] | None
    seed: int = 0
    epoch: int | None = None  # the epoch the loads are for
    loaded: dict[tuple[int, int], _WindowLoad] = dataclasses.field(default_factory=dict)
    loads_submitted: int = 0

    def drop_loads(self) -> None:
        _cancel(self.loaded.values())
        self.loaded = {}


def _cancel(loads: Iterable[_WindowLoad]) -> None:
    """Cancels the reads not started and waits for the running ones (they write into the ring)."""
    for loading, _ in loads:
        loading.cancel()


@dataclasses.dataclass
class _Spare:
    """The handover of the last finished pass, shared with ``with_seed`` clones."""

    handover: _Handover | None = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class ReadPipeline:
    """One input pipeline over one snapshot, with its options resolved."""

    def __init__(self, snapshot: Snapshot, options: ReaderOptions) -> None:
        names = [column.name for column in snapshot.metadata.columns]
        wanted = list(options.columns) if options.columns is not None else names
        if unknown := [c for c in wanted if c not in names]:
            raise UsageError(f"unknown columns {unknown}; {snapshot.path} has {names}")
        context, policy = options.context, options.shard_policy
        if policy is ShardPolicy.DATA and context.num_input_pipelines > 1 and options.shuffle and options.seed is None:
            raise UsageError(
                "shard_policy=DATA with shuffle=True needs the same seed on every input pipeline: pass seed=<int>"
            )
        self.snapshot = snapshot
        self.options = options
        self.columns = wanted
        self.seed = options.seed if options.seed is not None else secrets.randbits(63)
        all_pieces = assigned_pieces(snapshot.block_rows, policy, context)
        self.pieces = all_pieces[context.input_pipeline_id]
        self.step_plan: StepPlan = plan_steps(
            [sum(p.rows for p in pieces) for pieces in all_pieces],
            options.global_batch_size,
            policy,
            context,
            drop_remainder=options.drop_remainder,
        )
        if self.step_plan.steps == 0 and options.drop_remainder and snapshot.num_rows:
            rows = sum(p.rows for p in self.pieces)
            warnings.warn(
                f"{snapshot.path}: global_batch_size={options.global_batch_size} with drop_remainder=True leaves "
                f"0 steps per epoch (this input pipeline has {rows} rows); lower the batch size or pass "
                f"drop_remainder=False",
                stacklevel=5,
            )
        self.row_bytes = _row_bytes(snapshot, wanted)
        self.large_rows = self.row_bytes >= LARGE_ROW_BYTES
        self.window_rows = options.shuffle_buffer_size or max(1, int(AUTO_WINDOW_BYTES // self.row_bytes))
        self.replicas = context.replicas_per_pipeline
        self.source = BlockSource(snapshot, wanted, verify_checksums=options.verify_checksums)
        # Merged reads small enough that the read-ahead keeps every I/O thread busy, up to the store's sweet spot.
        self.max_range_bytes = max(1, min(block_io.COALESCE_BYTES, options.read_ahead_bytes // options.num_io_threads))
        self.empty_batch = {name: snapshot.element_spec[name].empty(0) for name in wanted}
        self._spare = _Spare()  # shared with with_seed() clones

    def _take_handover(self, start: Position) -> _Handover:
        """Window buffers for a pass from ``start``, and windows already loading for it.

        Reusing the buffers the previous iterator left keeps a new iterator (the
        usual ``for epoch ...: for batch in dataset``) from page-faulting fresh
        window memory every epoch. Its loads are used only by a pass that starts
        where they are for, with their seed: any other pass would load its own
        windows into their buffers while they still looked loaded.
        """
        with self._spare.lock:
            handover, self._spare.handover = self._spare.handover, None
        if handover is None:
            return _Handover(self._new_ring())
        if handover.seed != self.seed or start != Position(handover.epoch, 0):
            handover.drop_loads()
        return handover

    def _new_ring(self) -> list[WindowBuffer] | None:
        """One buffer per window in flight (current + ahead + the one just left).

        Shuffled batches are gathered copies, so window memory can be reused;
        unshuffled batches are views of their window, which must stay theirs.
        """
        if not self.options.shuffle:
            return None
        # A window closes at the piece that brings it to window_rows, so none is larger than this.
        largest = self.window_rows - 1 + max((piece.rows for piece in self.pieces), default=1)
        return [WindowBuffer(largest) for _ in range(self.options.reader_buffer_size + 2)]

    def _give_back(self, handover: _Handover) -> None:
        """Keeps one handover for the next iterator (iterators running at once each get their own)."""
        with self._spare.lock:
            self._spare.handover = handover

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

    def windows(self, epoch: int) -> list[order.Window]:
        if not self.options.shuffle:
            return order.epoch_windows(self.pieces, self.window_rows, None)
        seed = order.epoch_seed(self.seed, epoch, reshuffle_each_epoch=self.options.reshuffle_each_epoch)
        return order.epoch_windows(self.pieces, self.window_rows, seed)

    def steps(self, start: Position, stop_epoch: int | None) -> Iterator[tuple[Position, list[Columns]]]:
        """Per-replica batches from ``start`` until ``stop_epoch`` (None: forever)."""
        allocator.keep_freed_batches()
        handover = None
        try:
            # The I/O pool outlives the block pool: reads still decoding at the end of a pass wait for their I/O.
            with (
                concurrent.futures.ThreadPoolExecutor(self.options.num_io_threads, "snapfeed-io") as io_pool,
                concurrent.futures.ThreadPoolExecutor(self.options.num_reader_threads, "snapfeed-block") as pool,
            ):
                gatherer = _Gatherer(self, pool, io_pool, self._take_handover(start), stop_epoch)
                finished = False
                try:
                    yield from self._epochs(gatherer, start, stop_epoch)
                    finished = True
                finally:
                    handover = gatherer.hand_over(finished=finished)
        finally:
            if handover is not None:  # once the pool has finished every read it hands over
                self._give_back(handover)

    def _epochs(
        self, gatherer: _Gatherer, start: Position, stop_epoch: int | None
    ) -> Iterator[tuple[Position, list[Columns]]]:
        epoch, first_step = start.epoch, start.step
        while stop_epoch is None or epoch < stop_epoch:
            if self.steps_per_epoch == 0 and stop_epoch is None:
                raise UsageError(
                    f"{self.snapshot.path} yields no step per epoch ({self.snapshot.num_rows} rows, "
                    f"global_batch_size={self.options.global_batch_size}, drop_remainder=True); "
                    f"repeating forever would never yield"
                )
            for step in range(first_step, self.steps_per_epoch):
                start_row, stop_row = self.step_plan.step_range(step)
                batch = gatherer.gather(epoch, start_row, stop_row)
                nxt = Position(epoch, step + 1) if step + 1 < self.steps_per_epoch else Position(epoch + 1, 0)
                replicas = replica_ranges(stop_row - start_row, self.replicas)
                yield nxt, [{name: values[lo:hi] for name, values in batch.items()} for lo, hi in replicas]
            epoch, first_step = epoch + 1, 0


#: Read-ahead is bounded in bytes, but tiny windows (a small ``shuffle_buffer_size``, a small
#: snapshot) hold next to nothing: without a count bound an endless stream (num_epochs=None) would
#: plan and start windows of epoch after epoch ahead of the consumer, and every pass that ends early
#: (a restore, a break) would throw many away. AUTO windows (32 MiB) meet the byte bound first.
MAX_WINDOWS_AHEAD = 16


class _Gatherer:
    """Gathers stream rows out of windows that are loaded ahead of use, across epoch boundaries.

    Windows are loaded in stream order, ``reader_buffer_size`` ahead of the one
    being gathered, each into the next buffer of the ring (None: fresh memory).
    Their reads are submitted in that order, so the window needed first is read
    first. Beyond them, the blocks of further windows that are fetched (not read
    directly) are read ahead on the I/O pool while what fetches hold stays
    within ``read_ahead_bytes``.
    """

    def __init__(self, pipeline: ReadPipeline, pool, io_pool, handover: _Handover, stop_epoch: int | None) -> None:
        self._pipeline = pipeline
        self._pool = pool
        self._io_pool = io_pool
        self._ring = handover.ring
        self._stop_epoch = stop_epoch
        self._epoch_windows: dict[int, tuple[list[order.Window], list[int]]] = {}
        self._loaded: dict[tuple[int, int], _WindowLoad] = handover.loaded
        self._ahead: dict[tuple[int, int], _ReadAhead] = {}  # read ahead, not loaded yet
        self._next_need: tuple[tuple[int, int], int] | None = None  # the next window to read ahead, its bytes
        self._open_threads = pipeline.options.num_io_threads
        self._loads_submitted = handover.loads_submitted

    def _windows(self, epoch: int) -> tuple[list[order.Window], list[int]]:
        if epoch not in self._epoch_windows:
            for old in [e for e in self._epoch_windows if e < epoch - 1]:
                del self._epoch_windows[old]
            windows = self._pipeline.windows(epoch)
            self._epoch_windows[epoch] = (windows, [w.start for w in windows])
        return self._epoch_windows[epoch]

    def _following(self, key: tuple[int, int]) -> tuple[int, int] | None:
        epoch, index = key
        if index + 1 < len(self._windows(epoch)[0]):
            return epoch, index + 1
        if self._stop_epoch is not None and epoch + 1 > self._stop_epoch:
            return None  # past the epoch the next pass starts at
        return (epoch + 1, 0) if self._windows(epoch + 1)[0] else None

    def _fetch(self, key: tuple[int, int]) -> Fetch | None:
        """Starts reading the window's fetched blocks on the I/O pool (None: every piece is read directly)."""
        window = self._windows(key[0])[0][key[1]]
        pipeline = self._pipeline
        return pipeline.source.fetch(
            window.pieces,
            self._io_pool,
            max_bytes=pipeline.max_range_bytes,
            open_threads=self._open_threads,
        )

    def _load(self, key: tuple[int, int], buffer: WindowBuffer | None) -> _WindowLoad:
        """Starts loading a window: its row order and its reads (direct ones on the I/O pool, decoding
        on the block pool), with its blocks fetched ahead if they were."""
        window = self._windows(key[0])[0][key[1]]
        row_order = self._pool.submit(window.row_order)
        source = self._pipeline.source
        if self._pipeline.large_rows and (direct := source.direct_window(window.pieces, self._io_pool)):
            return Loading(self._pool, [], lambda _: direct), row_order
        fetch = self._ahead.pop(key).fetch if key in self._ahead else self._fetch(key)
        if self._pipeline.large_rows and window.seed is not None and len(window.pieces) > 1:
            reads = [functools.partial(source.read, piece, fetch) for piece in window.pieces]
            return Loading(self._pool, reads, DecodedParts, fetch=fetch), row_order
        return source.read_window(window.pieces, self._pool, buffer, io_pool=self._io_pool, fetch=fetch), row_order

    def _read_ahead(self, last_loaded: tuple[int, int]) -> None:
        """Starts reading the windows after ``last_loaded`` while what is read ahead (fetched blocks in
        flight or not decoded yet, direct blocks asked of the kernel) stays within ``read_ahead_bytes``;
        at least one window when nothing is held.

        Not into the epoch the pass stops before: only its first windows' loads are handed over.
        """
        budget = self._pipeline.options.read_ahead_bytes
        source = self._pipeline.source
        held = sum(ahead.held_bytes for ahead in self._ahead.values())
        held += sum(loading.held_bytes for loading, _ in self._loaded.values())
        key = self._following(last_loaded)
        while key is not None and key in self._ahead:
            key = self._following(key)
        while key is not None and (self._stop_epoch is None or key[0] < self._stop_epoch):
            window = self._windows(key[0])[0][key[1]]
            if self._next_need is None or self._next_need[0] != key:
                self._next_need = key, source.ahead_bytes(window.pieces, self._open_threads)
            need = self._next_need[1]
            if (held and held + need > budget) or len(self._ahead) >= MAX_WINDOWS_AHEAD:
                return
            self._ahead[key] = _ReadAhead(self._fetch(key), source.advise(window.pieces))
            held += need
            key = self._following(key)

    def _drop_before(self, key: tuple[int, int]) -> None:
        for stale in [k for k in self._loaded if k < key]:
            del self._loaded[stale]
        for stale in [k for k in self._ahead if k < key]:
            self._ahead.pop(stale).cancel()

    def _window(self, key: tuple[int, int]) -> tuple[Window, np.ndarray | None]:
        wanted: tuple[int, int] | None = key
        last_loaded = key
        for _ in range(self._pipeline.options.reader_buffer_size + 1):
            if wanted is None:
                break
            if wanted not in self._loaded:
                buffer = self._ring[self._loads_submitted % len(self._ring)] if self._ring else None
                self._loads_submitted += 1
                self._loaded[wanted] = self._load(wanted, buffer)
            last_loaded, wanted = wanted, self._following(wanted)
        self._read_ahead(last_loaded)
        loading, row_order = self._loaded[key]
        return loading.result(), row_order.result()

    def gather(self, epoch: int, start: int, stop: int) -> Columns:
        """Stream rows ``[start, stop)`` of ``epoch``, written once into a new batch.

        Shuffled rows go straight from their window to their slot, also when the
        batch spans windows (no concatenation pass). Unshuffled rows within one
        window are returned as views. Rows of direct windows are gathered in one
        go at the end, straight into the batch when every window is direct.
        """
        if start >= stop:
            return dict(self._pipeline.empty_batch)
        windows, starts = self._windows(epoch)
        index = bisect.bisect_right(starts, start) - 1
        self._drop_before((epoch, index))
        batch_rows, filled = stop - start, 0
        out: Columns | None = None
        direct = []  # (slot in the batch, window, positions in it)
        while start < stop:
            window = windows[index]
            data, row_order = self._window((epoch, index))
            lo, hi = start - window.start, min(stop, window.stop) - window.start
            rows = row_order[lo:hi] if row_order is not None else None
            if isinstance(data, DirectWindow):
                direct.append((filled, data, np.arange(lo, hi) if rows is None else rows))
            elif rows is None and filled == 0 and stop <= window.stop:
                return {name: values[lo:hi] for name, values in data.items()}
            else:
                # Copied now: the window's buffer may be reloaded once the gatherer moves on.
                out = out or self._new_batch(batch_rows)
                segment = {name: values[filled : filled + hi - lo] for name, values in out.items()}
                if isinstance(data, DecodedParts):
                    data.take_into(rows, segment)
                elif rows is None:
                    for name, values in data.items():
                        segment[name][...] = values[lo:hi]
                else:
                    for name, values in data.items():
                        take_rows(values, rows, segment[name])
            filled += hi - lo
            start = window.start + hi
            index += 1
        if not direct:
            return out
        gathered = self._gather_direct([(window, positions) for _, window, positions in direct])
        if out is None:
            return gathered
        done = 0
        for slot, _, positions in direct:  # beside windows of shards read the general way
            for name, values in gathered.items():
                out[name][slot : slot + len(positions)] = values[done : done + len(positions)]
            done += len(positions)
        return out

    def _new_batch(self, rows: int) -> Columns:
        return {name: np.empty((rows, *v.shape[1:]), v.dtype) for name, v in self._pipeline.empty_batch.items()}

    def _gather_direct(self, segments: list[tuple[DirectWindow, np.ndarray]]) -> Columns:
        pipeline = self._pipeline
        return direct_gather.gather(segments, pipeline.empty_batch, self._pool, pipeline.options.num_reader_threads)

    def hand_over(self, *, finished: bool) -> _Handover:
        """Ends the pass: what the next one can use (the loads of the epoch a finished pass stopped
        at), after cancelling the other reads (or waiting for them: they write into the ring)."""
        kept = {key: load for key, load in self._loaded.items() if finished and key[0] == self._stop_epoch}
        for ahead in self._ahead.values():
            ahead.cancel()  # reads ahead no load uses yet; one under way finishes before the I/O pool closes
        self._ahead = {}
        _cancel(load for key, load in self._loaded.items() if key not in kept)
        self._loaded = {}
        return _Handover(self._ring, self._pipeline.seed, self._stop_epoch, kept, self._loads_submitted)
