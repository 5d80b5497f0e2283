"""The reader core: plan + order + blocks composed into per-replica batches.

``ReadPipeline`` is everything fixed for a dataset (the plan for every epoch);
``ReadPipeline.steps(position)`` yields ``(next_position, per-replica batches)``
from any position, which is all a resumable iterator, the TensorFlow adapter
and the service workers need. Windows of the epoch stream are read ahead in a
thread pool while the current one is gathered into batches.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import copy
import dataclasses
import math
import secrets
import threading
from collections.abc import Iterator

import numpy as np

from reader import allocator, direct_gather, order
from reader.blocks import BlockSource, Columns, WindowBuffer
from reader.direct_gather import DirectWindow
from reader.gather import DecodedParts
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
    fixed = 0.0
    for column in snapshot.metadata.columns:
        if column.name in names and column.dtype not in ("binary", "string"):
            fixed += np.dtype(column.dtype).itemsize * math.prod(column.shape)
    stored = snapshot.metadata.num_bytes / max(1, snapshot.num_rows)
    return max(fixed, stored, 1.0)


def _empty_column(snapshot: Snapshot, name: str) -> np.ndarray:
    spec = snapshot.element_spec[name]
    dtype = object if isinstance(spec.dtype, str) else spec.dtype
    return np.empty((0, *spec.shape[1:]), dtype=dtype)


@dataclasses.dataclass
class _SpareRing:
    """The window buffers the last finished pass left for the next one."""

    spare: list[WindowBuffer] | None = None
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
        self.row_bytes = _row_bytes(snapshot, wanted)
        self.window_rows = options.shuffle_buffer_size or max(1, int(AUTO_WINDOW_BYTES // self.row_bytes))
        self.replicas = context.replicas_per_pipeline
        self.source = BlockSource(snapshot, wanted, verify_checksums=options.verify_checksums)
        self.empty_batch = {name: _empty_column(snapshot, name) for name in wanted}
        self._rings = _SpareRing()  # shared with with_seed() clones

    def _take_ring(self) -> list[WindowBuffer] | None:
        """Window buffers for one pass: the ones the previous iterator left, else new ones.

        Reusing them keeps a new iterator (the usual ``for epoch ...: for batch
        in dataset``) from page-faulting fresh window memory every epoch.
        """
        if not self.options.shuffle:
            return None
        with self._rings.lock:
            if self._rings.spare is not None:
                ring, self._rings.spare = self._rings.spare, None
                return ring
        return [WindowBuffer() for _ in range(self.options.reader_buffer_size + 2)]

    def _give_back(self, ring: list[WindowBuffer] | None) -> None:
        """Keeps one ring for the next iterator (iterators running at once each get their own)."""
        if ring is not None:
            with self._rings.lock:
                self._rings.spare = ring

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
        # Windows load on their own threads; each window's blocks fan out on the block pool
        # (one pool for both could deadlock with every thread waiting on its own blocks).
        with (
            concurrent.futures.ThreadPoolExecutor(self.options.num_reader_threads, "snapfeed-block") as pool,
            concurrent.futures.ThreadPoolExecutor(self.options.reader_buffer_size + 1, "snapfeed-window") as loader,
        ):
            # Shuffled batches are gathered copies, so window memory can be reused: one buffer per
            # window in flight (current + ahead + the one just left). Unshuffled batches are views.
            ring = self._take_ring()
            gatherer = _Gatherer(self, pool, loader, ring, stop_epoch)
            epoch, first_step = start.epoch, start.step
            try:
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
            finally:
                gatherer.close()
                self._give_back(ring)


class _Gatherer:
    """Gathers stream rows out of windows that are loaded ahead of use, across epoch boundaries.

    Windows are loaded in stream order, ``reader_buffer_size`` ahead of the one
    being gathered, each into the next buffer of the ring (None: fresh memory).
    """

    def __init__(self, pipeline: ReadPipeline, pool, loader, ring, stop_epoch: int | None) -> None:
        self._pipeline = pipeline
        self._pool = pool
        self._loader = loader
        self._ring = ring
        self._stop_epoch = stop_epoch
        self._epoch_windows: dict[int, tuple[list[order.Window], list[int]]] = {}
        self._loaded: dict[tuple[int, int], concurrent.futures.Future] = {}
        self._loads_submitted = 0

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
        if self._stop_epoch is not None and epoch + 1 >= self._stop_epoch:
            return None
        return (epoch + 1, 0) if self._windows(epoch + 1)[0] else None

    def _load(self, key: tuple[int, int], buffer: WindowBuffer | None) -> tuple[Window, np.ndarray | None]:
        window = self._windows(key[0])[0][key[1]]
        row_order = window.row_order()
        source = self._pipeline.source
        if direct := source.direct_window(window.pieces):
            return direct, row_order
        if row_order is not None and self._pipeline.row_bytes >= LARGE_ROW_BYTES and len(window.pieces) > 1:
            return DecodedParts(list(self._pool.map(source.read, window.pieces))), row_order
        return source.read_window(window.pieces, self._pool, buffer), row_order

    def _drop_before(self, key: tuple[int, int]) -> None:
        for stale in [k for k in self._loaded if k < key]:
            _release(self._loaded.pop(stale))

    def _window(self, key: tuple[int, int]) -> tuple[Window, np.ndarray | None]:
        wanted: tuple[int, int] | None = key
        for _ in range(self._pipeline.options.reader_buffer_size + 1):
            if wanted is None:
                break
            if wanted not in self._loaded:
                buffer = self._ring[self._loads_submitted % len(self._ring)] if self._ring else None
                self._loads_submitted += 1
                self._loaded[wanted] = self._loader.submit(self._load, wanted, buffer)
            wanted = self._following(wanted)
        return self._loaded[key].result()

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
                        np.take(values, rows, axis=0, out=segment[name])
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
        large = pipeline.row_bytes >= LARGE_ROW_BYTES
        return direct_gather.gather(
            segments,
            pipeline.empty_batch,
            row_readers=self._pool if large else None,
            threads=pipeline.options.num_reader_threads,
        )

    def close(self) -> None:
        """Cancels loads not started and waits for running ones (they write into shared buffers)."""
        for future in self._loaded.values():
            future.cancel()
        concurrent.futures.wait(self._loaded.values())
        for future in self._loaded.values():
            _release(future)
        self._loaded.clear()


def _release(load: concurrent.futures.Future) -> None:
    """Unmaps the pages a finished direct window touched (other windows hold no mapped pages)."""
    if load.done() and not load.cancelled() and load.exception() is None:
        data, _ = load.result()
        if isinstance(data, DirectWindow):
            data.release()
