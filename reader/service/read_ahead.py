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
the link with them, nor waits for their ``do_get`` round trips.
``close()`` cancels the streams still open (``epoch_batches`` calls it in a
``with contextlib.closing``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from reader.blocks import Columns
from reader.plan import Piece
from reader.service.worker_clients import Cut, SplitRead, WorkerClients

#: Leased splits whose streams are open ahead of the batcher (each ``splits.BLOCKS_PER_SPLIT`` blocks).
READ_AHEAD_SPLITS = 4


class SplitStream:
    """One split's record batches (rows in delivery order): ``open()`` starts its stream, ``batches()`` reads it."""

    def __init__(self, stream: Callable[[], Iterator[Columns]], on_first_batch: Callable[[], None]) -> None:
        self._stream = stream
        self._on_first_batch = on_first_batch
        self._batches: Iterator[Columns] | None = None
        self.done = False

    def open(self) -> None:
        if self._batches is None:
            self._batches = self._stream()

    def batches(self) -> Iterator[Columns]:
        self.open()
        for batch in self._batches:
            yield batch
            self._on_first_batch()
        self.done = True

    def close(self) -> None:
        if self._batches is not None:
            self._batches.close()


class ReadAhead:
    """Opens leased splits' streams from the workers (``start``) ahead of the batcher reading them."""

    def __init__(
        self, workers: WorkerClients, live_workers: Callable[[], list[str]], blocks: list[Piece], seed: int, epoch: int
    ) -> None:
        self._workers = workers
        self._live_workers = live_workers
        self._blocks = blocks
        self._seed = seed
        self._epoch = epoch
        self._first_handed_out = False
        self._waiting: list[SplitStream] = []  # started before the epoch's first batch was handed out
        self._streams: list[SplitStream] = []  # not read to their end yet

    def close(self) -> None:
        """Cancels every stream still open."""
        for stream in self._streams:
            stream.close()
        self._streams = []

    def start(self, split: int, workers: list[str], offset: int, cut: Cut) -> SplitStream:
        """Opens ``split``'s stream from its row ``offset`` (rows already delivered), cut as ``cut`` says."""
        stream = SplitStream(
            lambda: self._workers.stream_split(
                SplitRead(list(workers), self._live_workers, self._blocks, self._seed, self._epoch, split, offset, cut)
            ),
            self._first_batch_handed_out,
        )
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
