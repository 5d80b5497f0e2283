"""The window cache: the window memory and loads one pass over a pipeline leaves the next.

A pass (one ``ReadPipeline.steps`` run) takes the cache's windows when it
starts and puts them back when it ends. What it puts back is the ring of
``WindowBuffer``s its windows were loaded into, and, when it ran to its stop
epoch, the loads it had already started for the first windows of that epoch:
the epoch the next ``for batch in dataset`` starts at. So the usual
``for epoch ...: for batch in dataset`` neither page-faults fresh window
memory every epoch nor waits for a window to be read at its first batch.

Reads write into the ring's buffers, so a load the next pass cannot use is
cancelled, and one already running is waited for, before the buffer it writes
into can be handed out again. A pass in a forked process (a DataLoader worker
started after the trainer iterated) drops the loads it was left instead: they
ran on its parent's threads, which the fork did not copy, so none would end.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Callable

from reader.core import fork_safe
from reader.core.loading import Loading, WindowBuffer
from reader.core.plan import Position

#: A window of the epoch stream: (epoch, index of the window in the epoch).
WindowKey = tuple[int, int]
#: A window being loaded: its reads, and its row order (None: stored order).
WindowLoad = tuple[Loading, concurrent.futures.Future]


class CachedWindows:
    """The windows one pass works with: the ring of buffers they load into, and their loads by key.

    Windows are loaded into the ring's buffers in turn; the count of loads
    started goes on from pass to pass, so a pass's first new load does not
    reuse the buffer of a load it was left. No ring (None): every window is
    loaded into fresh memory.
    """

    def __init__(self, ring: list[WindowBuffer] | None) -> None:
        self._ring = ring
        self._loads: dict[WindowKey, WindowLoad] = {}
        self._loads_started = 0
        self._seed: int | None = None  # the seed and epoch the loads were left for
        self._epoch: int | None = None
        self._pid = os.getpid()  # the process whose threads run the loads

    def __contains__(self, key: WindowKey) -> bool:
        return key in self._loads

    @property
    def loading(self) -> bool:
        """Whether it holds loads (a pass's windows being read or read)."""
        return bool(self._loads)

    def __getitem__(self, key: WindowKey) -> WindowLoad:
        return self._loads[key]

    def start(self, key: WindowKey, load: Callable[[WindowBuffer | None], WindowLoad]) -> None:
        """Starts loading a window into the next buffer of the ring (``load`` starts the reads)."""
        buffer = self._ring[self._loads_started % len(self._ring)] if self._ring else None
        self._loads_started += 1
        self._loads[key] = load(buffer)

    @property
    def held_bytes(self) -> int:
        """Bytes the loads' fetches still hold for reads that have not decoded them yet."""
        return sum(loading.held_bytes for loading, _ in self._loads.values())

    def forget_before(self, key: WindowKey) -> None:
        """Lets go of the loads of windows before ``key``: windows are gathered in stream order, so
        theirs were, and their reads are done."""
        for gathered in [k for k in self._loads if k < key]:
            del self._loads[gathered]

    def end_pass(self, seed: int, next_epoch: int | None) -> None:
        """Keeps the loads of ``next_epoch``, where the next pass starts when it continues this one
        (None: keeps none), for a pass with ``seed``, and cancels the others."""
        self._cancel_loads(keep_epoch=next_epoch)
        self._seed, self._epoch, self._pid = seed, next_epoch, os.getpid()

    def _continued_by(self, seed: int, start: Position) -> bool:
        """Whether a pass from ``start`` with ``seed`` is the one the loads were left for."""
        return seed == self._seed and start.step == 0 and start.epoch == self._epoch

    def _drop_loads(self) -> None:
        """Lets go of the loads without waiting for them, in a forked process: its parent's threads ran
        them, and the fork did not copy those (the ring's buffers are this process's own copies)."""
        self._loads, self._pid = {}, os.getpid()

    def _cancel_loads(self, keep_epoch: int | None = None) -> None:
        """Cancels the reads not started and waits for the running ones (they write into the ring)."""
        kept = {key: load for key, load in self._loads.items() if key[0] == keep_epoch}
        for key, (loading, _) in self._loads.items():
            if key not in kept:
                loading.cancel()
        self._loads = kept


class WindowCache:
    """Holds the windows the last finished pass put back, for the next pass to take.

    Shared by a pipeline and its ``with_seed`` clones (the same windows, other
    seeds). It holds one set: passes running at once each take their own, and
    the last to end is the one kept.
    """

    def __init__(self, ring_size: int, capacity: int) -> None:
        """``ring_size`` buffers (0: no ring) sized for ``capacity`` rows (the largest window)."""
        self._ring_size = ring_size
        self._capacity = capacity
        self._cached: CachedWindows | None = None
        self._lock = fork_safe.Lock()

    def take(self, seed: int, start: Position) -> CachedWindows:
        """The cached windows for a pass from ``start`` with ``seed`` (a new ring when none are cached).

        Their loads are kept only for the pass that starts where and with the
        seed they were left for: any other pass would load its own windows into
        their buffers while they still looked loaded.
        """
        with self._lock:
            cached, self._cached = self._cached, None
        if cached is None:
            ring = [WindowBuffer(self._capacity) for _ in range(self._ring_size)]
            return CachedWindows(ring or None)
        if cached._pid != os.getpid():
            cached._drop_loads()
        elif not cached._continued_by(seed, start):
            cached._cancel_loads()
        return cached

    def put_back(self, cached: CachedWindows) -> None:
        """Keeps a pass's windows for the next pass (after ``end_pass``: the loads it kept may still be
        running, on the pools the next pass reads on too, and it waits for them)."""
        with self._lock:
            self._cached = cached
