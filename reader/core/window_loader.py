"""Which windows of the epoch stream are read when: loaded ahead of use, and read further ahead.

Windows are loaded in stream order, ``reader_buffer_size`` ahead of the one
being gathered, across epoch boundaries, each into the next buffer of the
pass's ring (``reader.core.window_cache``). Their reads are submitted in that
order, so the window needed first is read first: direct ones on the I/O pool,
decoding on the block pool. Beyond them, the blocks of further windows that
are fetched (not read directly) are read ahead on the I/O pool while what
fetches hold stays within ``read_ahead_bytes``; blocks of direct shards are
advised into the page cache instead.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np

from reader.core import order
from reader.core.batch import ColumnsWindow, DecodedParts, LoadedWindow
from reader.core.block_io import Fetch
from reader.core.blocks import BlockReader
from reader.core.loading import Loading, WindowBuffer
from reader.core.window_cache import CachedWindows, WindowKey, WindowLoad

#: Read-ahead is bounded in bytes, but tiny windows (a small ``shuffle_buffer_size``, a small
#: snapshot) hold next to nothing: without a count bound an endless stream (num_epochs=None) would
#: plan and start windows of epoch after epoch ahead of the consumer, and every pass that ends early
#: (a restore, a break) would throw many away. AUTO windows (32 MiB) meet the byte bound first.
MAX_WINDOWS_AHEAD = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoadSettings:
    """How a pipeline's windows are loaded and read ahead (resolved from its ``ReaderOptions``)."""

    large_rows: bool  # rows of ``LARGE_ROW_BYTES`` or more: gathered row by row, or read straight into the batch
    max_range_bytes: int  # the largest coalesced read of fetched blocks
    read_ahead_bytes: int  # bytes held by reads ahead of the windows loaded
    windows_ahead: int  # windows loaded ahead of the one being gathered (``reader_buffer_size``)
    open_threads: int  # shards opened at once (their round trips overlap)


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


class WindowLoader:
    """Loads the windows of one pass ahead of use, into the windows it took from the cache."""

    def __init__(
        self,
        source: BlockReader,
        epoch_order: order.EpochOrder,
        settings: LoadSettings,
        pool,
        io_pool,
        cached: CachedWindows,
        stop_epoch: int | None,
    ) -> None:
        """Windows of ``epoch_order`` read from ``source``: decoded on ``pool``, read on ``io_pool``, into the
        buffers of ``cached`` (taken from the pipeline's ``WindowCache``), up to ``stop_epoch`` (None: forever)."""
        self._source = source
        self._order = epoch_order
        self._settings = settings
        self._pool = pool
        self._io_pool = io_pool
        self._cached = cached
        self._stop_epoch = stop_epoch
        self._epoch_windows: dict[int, tuple[list[order.Window], list[int]]] = {}
        self._ahead: dict[WindowKey, _ReadAhead] = {}  # read ahead, not loaded yet
        self._next_need: tuple[WindowKey, int] | None = None  # the next window to read ahead, its bytes
        self.waited = 0.0  # seconds window() waited for loads (reads run there count to their pool's stage)
        # The window whose loads window() started last (it and those after it), and the last of them.
        self._started_for: tuple[WindowKey | None, WindowKey] = (None, (0, 0))
        self._first_loaded = False  # whether window() was asked for a window yet in this pass

    def windows(self, epoch: int) -> tuple[list[order.Window], list[int]]:
        """The epoch's windows and the stream row each starts at."""
        if epoch not in self._epoch_windows:
            for old in [e for e in self._epoch_windows if e < epoch - 1]:
                del self._epoch_windows[old]
            windows = self._order.windows(epoch)
            self._epoch_windows[epoch] = (windows, [w.start for w in windows])
        return self._epoch_windows[epoch]

    def _following(self, key: WindowKey) -> WindowKey | None:
        epoch, index = key
        if index + 1 < len(self.windows(epoch)[0]):
            return epoch, index + 1
        if self._stop_epoch is not None and epoch + 1 > self._stop_epoch:
            return None  # past the epoch the next pass starts at
        return (epoch + 1, 0) if self.windows(epoch + 1)[0] else None

    def _fetch(self, key: WindowKey) -> Fetch | None:
        """Starts reading the window's fetched blocks on the I/O pool (None: every piece is read directly)."""
        window = self.windows(key[0])[0][key[1]]
        settings = self._settings
        return self._source.fetch(
            window.pieces, self._io_pool, max_bytes=settings.max_range_bytes, open_threads=settings.open_threads
        )

    def _load(self, key: WindowKey, buffer: WindowBuffer | None) -> WindowLoad:
        """Starts loading a window: its row order and its reads (direct ones on the I/O pool, decoding
        on the block pool), with its blocks fetched ahead if they were."""
        window = self.windows(key[0])[0][key[1]]
        row_order = self._pool.submit(window.row_order)
        source, large_rows = self._source, self._settings.large_rows
        if large_rows and (direct := source.direct_window(window.pieces, self._io_pool)):
            return Loading(self._pool, [], lambda _: direct), row_order
        fetch = self._ahead.pop(key).fetch if key in self._ahead else self._fetch(key)
        if large_rows and window.seed is not None and len(window.pieces) > 1:
            reads = [functools.partial(source.read, piece, fetch) for piece in window.pieces]
            return Loading(self._pool, reads, DecodedParts, fetch=fetch), row_order
        loading = source.read_window(window.pieces, self._pool, buffer, io_pool=self._io_pool, fetch=fetch)
        return loading.then(ColumnsWindow), row_order

    def _read_ahead(self, last_loaded: WindowKey) -> None:
        """Starts reading the windows after ``last_loaded`` while what is read ahead (fetched blocks in
        flight or not decoded yet, direct blocks asked of the kernel) stays within ``read_ahead_bytes``;
        at least one window when nothing is held.

        Not into the epoch the pass stops before: only its first windows' loads are left to the next pass.
        """
        budget, source = self._settings.read_ahead_bytes, self._source
        held = sum(ahead.held_bytes for ahead in self._ahead.values()) + self._cached.held_bytes
        key = self._following(last_loaded)
        while key is not None and key in self._ahead:
            key = self._following(key)
        while key is not None and (self._stop_epoch is None or key[0] < self._stop_epoch):
            window = self.windows(key[0])[0][key[1]]
            if self._next_need is None or self._next_need[0] != key:
                self._next_need = key, source.ahead_bytes(window.pieces, self._settings.open_threads)
            need = self._next_need[1]
            if (held and held + need > budget) or len(self._ahead) >= MAX_WINDOWS_AHEAD:
                return
            self._ahead[key] = _ReadAhead(self._fetch(key), source.advise(window.pieces, self._io_pool))
            held += need
            key = self._following(key)

    @property
    def read_ahead_windows(self) -> int:
        """Windows read ahead of their load now."""
        return len(self._ahead)

    def drop_before(self, key: WindowKey) -> None:
        """Lets go of the windows before ``key``: the gatherer has moved past them."""
        self._cached.forget_before(key)
        for stale in [k for k in self._ahead if k < key]:
            self._ahead.pop(stale).cancel()

    def window(self, key: WindowKey) -> tuple[LoadedWindow, np.ndarray | None]:
        """The window, loaded, and its row order (None: stored order); starts loading the windows after
        it and reading further ones ahead."""
        if key != self._started_for[0]:  # the loads from it on were started at its first step
            wanted: WindowKey | None = key
            last_loaded = key
            for _ in range(self._settings.windows_ahead + 1):
                if wanted is None:
                    break
                if wanted not in self._cached:
                    self._cached.start(wanted, functools.partial(self._load, wanted))
                last_loaded, wanted = wanted, self._following(wanted)
            self._started_for = key, last_loaded
        loading, row_order = self._cached[key]
        if self._first_loaded or loading.done:
            # Not before the pass's first window is in: its reads and the next window's have the
            # connections to themselves, so the first batch comes sooner (read-ahead starts a step later).
            self._read_ahead(self._started_for[1])
        self._first_loaded = True
        if loading.done and row_order.done():
            return loading.result(), row_order.result()
        started = time.perf_counter()
        loaded = loading.result(), row_order.result()
        self.waited += time.perf_counter() - started
        return loaded

    def end_pass(self, *, finished: bool) -> CachedWindows:
        """Ends the pass: cancels what is read ahead (a read under way finishes before the I/O pool
        closes) and the loads the next pass cannot use; the windows to put back in the cache.

        A pass that ran to its stop epoch keeps the loads it started for that epoch, where the next
        pass starts when it continues this one.
        """
        for ahead in self._ahead.values():
            ahead.cancel()
        self._ahead = {}
        self._cached.end_pass(self._order.seed, self._stop_epoch if finished else None)
        return self._cached
