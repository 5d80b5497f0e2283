"""The process's download threads for the shard cache: chunks a read waits for first, a few threads kept for them.

One queue per process serves every download (``reader.core.cache.shard_fill.Filling``)
of every cache: ``DOWNLOAD_THREADS`` ranged GETs in flight over all shards.
Chunks are served by priority, each priority in the order asked: a chunk a
read waits for (``DEMANDED``), then one a read will soon need (``AHEAD``,
windows read ahead), then the rest of a download (``BACKGROUND``).
``URGENT_THREADS`` of the threads download only the first two kinds, so a
read never waits for every thread's background GET to end before its own
starts (on the remote bench, the cache's first batch 0.88 -> 0.69 s).

A queued item is anything with ``claim(chunk)`` (whether this thread should
land it: a chunk queued twice is landed once), ``land(chunk)`` and
``fail(exc, disk=)``. A forked child has none of its parent's threads: it
makes a queue of its own on first use.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
from typing import Protocol

from reader.core import fork_safe

#: Ranged GETs in flight for downloads, over all shards of this process.
DOWNLOAD_THREADS = 16
#: Of those, threads that download only what a read waits for or will soon (``Queue``).
URGENT_THREADS = 4
DEMANDED, AHEAD, BACKGROUND = 0, 1, 2  # a read waits for it; a read soon will; the rest of the download


class Download(Protocol):
    """What is queued: a download of chunks (``reader.core.cache.shard_fill.Filling``)."""

    def claim(self, chunk: int) -> bool: ...

    def land(self, chunk: int) -> None: ...

    def fail(self, exc: BaseException, *, disk: bool) -> None: ...


class Queue:
    """Chunks to download, demanded ones first, each in the order asked; served by daemon threads, of which
    ``urgent_threads`` download only chunks a read waits for or will soon: a read never waits for every
    thread's background GET to end before its own starts."""

    def __init__(self, threads: int, urgent_threads: int) -> None:
        self._heap: list = []
        lock = threading.Lock()
        self._any = threading.Condition(lock)
        self._urgent = threading.Condition(lock)
        self._order = itertools.count()
        for index in range(threads):
            urgent = index < urgent_threads
            threading.Thread(target=self._serve, args=(urgent,), name=f"snapfeed-cache-{index}", daemon=True).start()

    def push(self, priority: int, download: Download, chunk: int) -> None:
        with self._any:
            heapq.heappush(self._heap, (priority, next(self._order), download, chunk))
            self._any.notify()
            if priority < BACKGROUND:
                self._urgent.notify()

    def _serve(self, urgent: bool) -> None:
        ready = self._urgent if urgent else self._any
        while True:
            with ready:
                while not self._heap or (urgent and self._heap[0][0] == BACKGROUND):
                    ready.wait()
                _, _, download, chunk = heapq.heappop(self._heap)
            if download.claim(chunk):  # a chunk demanded after it was queued is queued twice: fetched once
                try:
                    download.land(chunk)
                except BaseException as exc:  # noqa: BLE001 - never a reader left waiting for a chunk
                    download.fail(exc, disk=True)


_MADE = fork_safe.Lock()
_QUEUES: list[Queue] = []  # the process's one queue, made on first use


def get() -> Queue:
    """This process's queue (made, with its threads, on first use)."""
    with _MADE:
        if not _QUEUES:
            _QUEUES.append(Queue(DOWNLOAD_THREADS, URGENT_THREADS))
        return _QUEUES[0]


os.register_at_fork(after_in_child=_QUEUES.clear)
