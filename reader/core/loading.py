"""Reads started on a pool and waited for together (``Loading``), and the per-column arrays windows are read
into, reused from window to window (``WindowBuffer``).

What the block reader (``reader.core.blocks``) returns for a window and reads it into, and what the window
loader and cache (``reader.core.window_loader``, ``reader.core.window_cache``) hold.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence

from reader.core.allocator import Columns
from reader.core.block_io import Fetch
from reader.core.snapshot import Snapshot


def _run_here(pool, read: Callable[[], object]) -> object:
    """A read its pool never started, run by the caller: timed as the pool's tasks are when the pool is a
    ``reader.core.stats.TimedPool`` (the gatherer helping load a window does decode work, not gathering)."""
    run_here = getattr(pool, "run_here", None)
    return run_here(read) if run_here is not None else read()


class Loading:
    """Reads started on a pool; ``result()`` waits for them and assembles what they read.

    Reads are submitted by whoever needs them, in the order they are needed, so
    one pool serves every window and no pool thread waits on another's tasks.
    The first caller of ``result()`` runs the reads no pool thread has started
    yet itself (from the last one back, while the pool works from the first),
    so it helps instead of idling. A read may hand the rest of its work to
    another pool and return that future (``BlockReader._read_direct``): it is
    waited for before the result is assembled.
    """

    _PENDING = object()

    def __init__(
        self,
        pool,
        reads: list[Callable[[], object]],
        assemble: Callable[[list], object],
        *,
        fetch: Fetch | None = None,
    ) -> None:
        """``pool`` is one executor for every read, or a list of one per read; ``fetch`` holds the
        coalesced reads the reads decode (cancelled with them)."""
        pools = pool if isinstance(pool, list) else [pool] * len(reads)
        self._reads = reads
        self._pools = pools
        self._tasks = [executor.submit(read) for executor, read in zip(pools, reads, strict=True)]
        self._assemble = assemble
        self._fetch = fetch
        self._result = self._PENDING

    def result(self):
        if self._result is self._PENDING:
            results = [None] * len(self._tasks)
            for index in reversed(range(len(self._tasks))):
                if self._tasks[index].cancel():
                    results[index] = _run_here(self._pools[index], self._reads[index])
            for index, task in enumerate(self._tasks):
                if not task.cancelled():
                    results[index] = task.result()
            for index, handed_over in enumerate(results):
                if isinstance(handed_over, concurrent.futures.Future):
                    results[index] = handed_over.result()
            self._result = self._assemble(results)
            self._reads, self._pools, self._fetch = [], [], None  # what they read is in the result now
        return self._result

    @property
    def done(self) -> bool:
        """Whether ``result()`` has assembled the result (later calls return at once)."""
        return self._result is not self._PENDING

    def then(self, convert: Callable[[object], object]) -> Loading:
        """This loading, with what its reads assembled passed through ``convert`` (before ``result()``)."""
        assemble = self._assemble
        self._assemble = lambda results: convert(assemble(results))
        return self

    @property
    def held_bytes(self) -> int:
        """Bytes its fetch still holds for reads that have not decoded them yet."""
        fetch = self._fetch
        return fetch.held_bytes if fetch is not None else 0

    def cancel(self) -> None:
        """Cancels the reads not started and waits for the others (they may write into shared buffers)."""
        for task in self._tasks:
            task.cancel()
        if self._fetch is not None:
            self._fetch.cancel()  # a read waiting for a cancelled fetch ends with CancelledError
        concurrent.futures.wait(self._tasks)
        handed_over = [
            task.result()
            for task in self._tasks
            if not task.cancelled()
            and task.exception() is None
            and isinstance(task.result(), concurrent.futures.Future)
        ]
        for rest in handed_over:
            rest.cancel()
        concurrent.futures.wait(handed_over)


class WindowBuffer:
    """Per-column arrays reused from window to window.

    Sized for ``capacity`` rows (the largest window of the pipeline) the first
    time, so windows of a few rows more than the last never allocate (and
    page-fault) fresh memory; grown only when a window is larger still.
    """

    def __init__(self, capacity: int = 0) -> None:
        self._capacity = capacity
        self._arrays: Columns = {}

    def arrays(self, snapshot: Snapshot, names: Sequence[str], rows: int) -> Columns:
        spec = snapshot.element_spec
        for name in names:
            current = self._arrays.get(name)
            if current is None or len(current) < rows:
                self._arrays[name] = spec[name].empty(max(rows, self._capacity))
        return {name: self._arrays[name][:rows] for name in names}
