"""The worker side of a distributed_epoch consumer: leased splits streamed from the workers ahead of the batcher.

Each split is read on a fetch thread, a record batch at a time, and each
is handed over as soon as it arrived: the batcher hands out a split's
first batch while the rest of the split is still on the way (reading a
whole split first held every epoch's first batch for the whole split).
A ``ReadAhead`` owns the fetch threads; ``close()`` stops them (``epoch_batches``
calls it in a ``with contextlib.closing``).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable, Iterator

from reader.blocks import Columns
from reader.plan import Piece
from reader.service.worker_clients import Cut, WorkerClients

#: Leased splits fetched concurrently ahead of the batcher (each ``splits.BLOCKS_PER_SPLIT`` blocks).
READ_AHEAD_SPLITS = 4

_END = object()


class SplitStream:
    """One split's record batches (rows in delivery order), as they arrive."""

    def __init__(self) -> None:
        self._arrived: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, item) -> None:
        self._arrived.put(item)

    def batches(self) -> Iterator[Columns]:
        """Waits for each record batch in turn; a fetch that failed raises here, on the consumer's thread."""
        while (item := self._arrived.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item


class ReadAhead:
    """Starts streaming leased splits from the workers (``start``), ``READ_AHEAD_SPLITS`` at a time."""

    def __init__(
        self, workers: WorkerClients, live_workers: Callable[[], list[str]], blocks: list[Piece], seed: int, epoch: int
    ) -> None:
        self._workers = workers
        self._live_workers = live_workers
        self._blocks = blocks
        self._seed = seed
        self._epoch = epoch
        self._closed = threading.Event()
        #: Set once the epoch's first split has arrived: until then it streams alone (see ``_fetch``).
        self._first_arrived = threading.Event()
        self._started = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(READ_AHEAD_SPLITS, "snapfeed-fetch")

    def close(self) -> None:
        """Drops the fetches not started and returns once the running ones stopped (at their next block)."""
        self._closed.set()
        self._first_arrived.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def start(self, split: int, workers: list[str], offset: int, cut: Cut) -> SplitStream:
        """Streams ``split`` from its row ``offset`` (rows already delivered), cut as ``cut`` says, on a fetch thread."""
        stream = SplitStream()
        self._pool.submit(self._fetch, stream, split, list(workers), offset, cut, first=not self._started)
        self._started += 1
        return stream

    def _fetch(
        self, stream: SplitStream, split: int, workers: list[str], offset: int, cut: Cut, *, first: bool
    ) -> None:
        """Streams a split into ``stream``; the epoch's first split alone, the first batch waits on it.

        The others start once it has arrived (or failed): streamed all at once
        they shared the workers and the link with it, and held up the epoch's
        first batch by about as much as the first split's own transfer took.
        """
        if not first:
            self._first_arrived.wait()
        if self._closed.is_set():
            return
        batches = self._workers.stream_split(
            workers, self._live_workers, self._blocks, self._seed, self._epoch, split, offset, cut
        )
        try:
            for batch in batches:
                if self._closed.is_set():
                    return
                stream.put(batch)
            stream.put(_END)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the consumer's thread (SplitStream.batches)
            stream.put(exc)
        finally:
            batches.close()
            if first:
                self._first_arrived.set()
