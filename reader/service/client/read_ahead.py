"""The worker side of a distributed_epoch consumer: leased splits' streams opened ahead of the batcher.

The consumer's own thread reads every split's record batches, in assignment
order; there are no fetch threads. Reading ahead is the workers': a split's
stream is opened (``do_get``) as soon as it is leased, and its worker starts
gathering and sending while earlier splits are still being read, up to what
gRPC's flow control lets through. A fetch thread per split, handing each
record batch over to the consumer's thread, cost more CPU than it saved
(a wake-up per batch, and the GIL passed between threads).

The epoch's first split is opened alone: the others open once its first
batch was handed out, so that the first batch shares neither the workers nor
the link with them, nor waits for their ``do_get`` round trips. It may even
be open before its lease (``open_expected``: the split this consumer leased
first last epoch, opened while the job request is answered,
``first_lease.FirstLease``): the first ``start`` takes it over when the
dispatcher leased that very split, and cancels it otherwise.
``close()`` cancels the streams still open (``epoch_batches`` calls it in a
``with contextlib.closing``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pyarrow as pa

from reader.core.allocator import Columns
from reader.service.client.worker_clients import Cut, SplitRead, WorkerClients
from reader.service.splits import SplitOrder
from schemas.errors import SnapfeedError

log = logging.getLogger(__name__)

#: Leased splits whose streams are open ahead of the batcher (each ``splits.BLOCKS_PER_SPLIT`` blocks).
READ_AHEAD_SPLITS = 4


class SplitStream:
    """One split's record batches (rows in delivery order): ``open()`` starts its stream, ``batches()`` reads it.

    ``after_batch`` is called after each batch handed out (the ``ReadAhead`` that reads it opens the
    streams waiting for the epoch's first batch then).
    """

    def __init__(self, read: SplitRead, workers: WorkerClients) -> None:
        self.read = read
        self._workers = workers
        self.after_batch: Callable[[], None] = lambda: None
        self._batches: Iterator[Columns] | None = None
        self.done = False

    def open(self) -> None:
        if self._batches is None:
            self._batches = self._workers.stream_split(self.read)

    def batches(self) -> Iterator[Columns]:
        self.open()
        for batch in self._batches:
            yield batch
            self.after_batch()
        self.done = True

    def close(self) -> None:
        if self._batches is not None:
            self._batches.close()


def open_expected(workers: WorkerClients, read: SplitRead) -> SplitStream | None:
    """The stream of a split expected to be leased, opened now (``read.expected``); None when its worker failed.

    A worker that cannot serve it now is the leased path's to report (it asks
    every live worker, and says why none answered); here it only costs the
    head start.
    """
    stream = SplitStream(read, workers)
    try:
        stream.open()
    except (SnapfeedError, pa.ArrowException) as exc:
        log.debug("split %d not opened ahead of its lease: %s", read.split, exc)
        return None
    return stream


class ReadAhead:
    """Opens leased splits' streams from the workers (``start``) ahead of the batcher reading them.

    ``expected``: a split's stream opened before its lease (``open_expected``),
    taken over by the first ``start`` of that split, cut the same way.
    """

    def __init__(
        self,
        workers: WorkerClients,
        live_workers: Callable[[], list[str]],
        order: SplitOrder,
        seed: int,
        epoch: int,
        expected: SplitStream | None = None,
    ) -> None:
        self._workers = workers
        self._live_workers = live_workers
        self._order = order
        self._seed = seed
        self._epoch = epoch
        self._expected = expected
        self._first_handed_out = False
        self._waiting: list[SplitStream] = []  # started before the epoch's first batch was handed out
        self._streams: list[SplitStream] = []  # not read to their end yet

    def close(self) -> None:
        """Cancels every stream still open (the expected one too, when no lease took it over)."""
        for stream in [*self._streams, *([self._expected] if self._expected else [])]:
            stream.close()
        self._streams, self._expected = [], None

    def start(self, split: int, workers: list[str], offset: int, cut: Cut) -> SplitStream:
        """Opens ``split``'s stream from its row ``offset`` (rows already delivered), cut as ``cut`` says."""
        read = SplitRead(list(workers), self._live_workers, self._order, self._seed, self._epoch, split, offset, cut)
        stream, self._expected = self._expected, None
        if stream is None or not stream.read.same_rows(read):
            if stream is not None:
                stream.close()
            stream = SplitStream(read, self._workers)
        stream.after_batch = self._first_batch_handed_out
        self._streams = [*(s for s in self._streams if not s.done), stream]
        if self._first_handed_out or len(self._streams) == 1:
            stream.open()
        else:
            self._waiting.append(stream)
        return stream

    def _first_batch_handed_out(self) -> None:
        if not self._first_handed_out:
            self._first_handed_out = True
            for stream in self._waiting:
                stream.open()
            self._waiting = []
