"""One epoch of a service job as the consumer reads it (docs/architecture.md §5.5), and where it stands (``Cursor``).

distributed_epoch (``DistributedEpoch``): lease splits from the dispatcher,
fetch them from the workers over Arrow Flight, cut them into batches, and
acknowledge each split once every row of it was delivered in a batch; a
``Renewer`` thread keeps the leases alive. parallel_epochs (``parallel_epoch``):
every worker streams the whole snapshot shuffled its own way and the consumer
interleaves the streams (each row arrives once per worker).

The ``Cursor`` is what ``get_state`` saves: rows delivered per source and the
next assignment to ask for, so a restored consumer repeats and skips nothing.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import numpy as np

from reader.blocks import Columns
from reader.service import splits
from reader.service.connection import ServiceConnection, ServiceUnavailableError
from reader.service.delivery import Delivered, DeliveryBatcher
from reader.service.dispatch_state import PARALLEL
from reader.service.rpc import DispatcherStub
from reader.service.worker_clients import WorkerClients
from schemas.errors import UsageError
from schemas.service_pb2 import AckRequest, JobRequest, LeaseRequest

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05
#: Leased splits fetched concurrently ahead of the batcher (each ``splits.BLOCKS_PER_SPLIT`` blocks).
READ_AHEAD_SPLITS = 4


@dataclasses.dataclass
class Cursor:
    """Where a consumer is in an epoch: what ``get_state`` saves.

    ``held``: source -> rows delivered, for every source not finished yet (a
    split's assignment index, or a worker address in parallel_epochs).
    ``next_index``: the next assignment to ask the dispatcher for.
    """

    epoch: int
    consumer: str
    next_index: int = 0
    held: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def fresh(cls, epoch: int, job_name: str) -> Cursor:
        return cls(epoch, f"{job_name}/{uuid.uuid4().hex[:12]}")

    def deliver(self, delivered: Delivered) -> None:
        for source, rows in delivered:
            self.held[source] = self.held.get(source, 0) + rows


def epoch_batches(
    connection: ServiceConnection,
    workers: WorkerClients,
    block_rows: list[list[int]],
    request: JobRequest,
    cursor: Cursor,
    batcher: DeliveryBatcher,
) -> Iterator[Columns]:
    """One epoch of the job ``request`` names, from where ``cursor`` stands, as ``batcher`` cuts it."""
    with connection.channel() as channel:
        stub = DispatcherStub(channel)
        job = connection.call(stub.GetJob, request)
        if connection.mode == PARALLEL:

            def streams_read() -> None:
                connection.call(stub.StreamsRead, LeaseRequest(job_id=job.job_id, consumer=cursor.consumer))

            yield from parallel_epoch(workers, connection.address, job, cursor, batcher, streams_read)
            return
        renewer = Renewer(connection, stub, job.job_id, cursor.consumer, job.lease_seconds)
        try:
            yield from DistributedEpoch(connection, workers, block_rows, stub, request, job, cursor, batcher).batches()
        finally:
            renewer.stop()


def parallel_epoch(
    workers: WorkerClients,
    address: str,
    job,
    cursor: Cursor,
    batcher: DeliveryBatcher,
    streams_read: Callable[[], None],
) -> Iterator[Columns]:
    """Every worker's whole-epoch stream, interleaved; each resumes at the rows it already delivered.

    ``streams_read`` is called once every stream has ended (the dispatcher's ``status`` then shows the job
    finished when all its consumers got there).
    """
    if not job.workers:
        raise ServiceUnavailableError(f"the dispatcher at {address} has no live workers")
    streams = {}
    for worker in job.workers:
        streams[worker] = workers.stream_epoch(worker, job.seed, cursor.epoch, cursor.held.get(worker, 0))
    while streams:
        for worker, stream in list(streams.items()):
            block = next(stream, None)
            if block is None:
                del streams[worker]
                continue
            batcher.add(worker, block)
            for batch, delivered in batcher.full_batches():
                cursor.deliver(delivered)
                yield batch
    streams_read()
    batch, delivered = batcher.remainder()
    cursor.deliver(delivered)
    if batch is not None:
        yield batch


class DistributedEpoch:
    """One consumer's distributed_epoch: its assignments, in order, cut into batches.

    A restored cursor first re-reads the assignments it held (from the rows it
    had delivered), then asks for assignment ``next_index`` and on: the
    dispatcher answers with the split it gave this consumer before (re-read
    after a restore), or a new one. Up to ``READ_AHEAD_SPLITS`` leased splits
    are fetched concurrently (round-robin over the workers) while batches are
    cut, always consumed in assignment order so a restore repeats the order;
    one lease round trip, in the background, tops the read-ahead up. A split
    is acknowledged (in the background) when all its rows were delivered in
    batches. When
    no split is pending for now (other consumers hold the last ones), the
    partial batch is delivered so that this consumer's own splits can be
    acknowledged and nobody waits on anybody.
    """

    def __init__(
        self,
        connection: ServiceConnection,
        workers: WorkerClients,
        block_rows: list[list[int]],
        stub,
        request: JobRequest,
        job,
        cursor: Cursor,
        batcher: DeliveryBatcher,
    ) -> None:
        self._workers = workers
        self._call = connection.call
        self._stub = stub
        self._request = request
        self._job = job
        self._cursor = cursor
        self._batcher = batcher
        self._blocks = splits.job_blocks(block_rows, job.seed, request.iteration)
        self._split_rows = [
            sum(piece.rows for piece in splits.split_blocks(self._blocks, split))
            for split in range(splits.split_count(self._blocks))
        ]
        self._split_of: dict[int, int] = {}
        self._acking: dict[int, concurrent.futures.Future] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(READ_AHEAD_SPLITS, "snapfeed-fetch")
        #: Dispatcher calls (leases, acks) run here, off the thread that cuts batches and off the fetches.
        self._control = concurrent.futures.ThreadPoolExecutor(2, "snapfeed-lease")

    def _lease(self, index: int, count: int):
        """Assignments ``index`` .. ``index + count - 1`` in one round trip (fewer: none pending for now)."""
        request = LeaseRequest(job_id=self._job.job_id, consumer=self._cursor.consumer, index=index, count=count)
        return self._call(self._stub.LeaseSplit, request)

    def _refresh_workers(self) -> list[str]:
        return list(self._call(self._stub.GetJob, self._request).workers)

    def _fetch(self, leased, workers, offset: int) -> tuple[int, concurrent.futures.Future]:
        self._split_of[leased.index] = leased.split
        return leased.index, self._pool.submit(self._fetch_rows, list(workers), leased.split, offset)

    def _fetch_rows(self, workers: list[str], split: int, offset: int) -> list[tuple[Columns, np.ndarray]]:
        """Per block still needed: (the rows a worker sent, the positions putting them in delivery order).

        Runs on a fetch thread.
        """
        epoch = self._request.iteration
        parts = splits.remaining_parts(self._blocks, self._job.seed, epoch, split, offset)
        sent = [len(part.order) for part in parts]
        blocks = self._workers.fetch_split(workers, self._refresh_workers, self._job.seed, epoch, split, offset, sent)
        return [(block, part.positions()) for block, part in zip(blocks, parts, strict=True)]

    def _hand_out(self, cut: Iterator[tuple[Columns, Delivered]]) -> Iterator[Columns]:
        for batch, delivered in cut:
            self._deliver(delivered)
            if batch is not None:
                yield batch

    def _deliver(self, delivered: Delivered) -> None:
        """Counts delivered rows and sends the ack of every split whose rows were all delivered.

        Acks go out in the background; a split stays in the cursor (fully
        delivered) until its ack is confirmed, so a state saved in between
        makes the restored consumer send the ack again instead of leaving the
        split unacknowledged forever.
        """
        self._cursor.deliver(delivered)
        for index, _ in delivered:
            split = self._split_of[index]
            if self._cursor.held[index] == self._split_rows[split] and index not in self._acking:
                self._acking[index] = self._control.submit(self._ack, split)

    def _ack(self, split: int) -> None:
        try:
            self._call(
                self._stub.AckSplit, AckRequest(job_id=self._job.job_id, split=split, consumer=self._cursor.consumer)
            )
        except UsageError as exc:
            log.warning("split %d was delivered here and by another consumer (this one's lease lapsed): %s", split, exc)

    def _settle_acks(self, *, wait: bool = False) -> None:
        """Drops the splits whose acks were confirmed from the cursor (all of them with ``wait``)."""
        for index, acked in list(self._acking.items()):
            if wait or acked.done():
                acked.result()
                del self._acking[index]
                del self._cursor.held[index]

    def _resumed(self) -> list[tuple[int, concurrent.futures.Future]]:
        """Fetches of the assignments a restored cursor held, from the rows it had delivered."""
        fetches = []
        for index, delivered in list(self._cursor.held.items()):
            reply = self._lease(index, 1)
            (leased,) = reply.splits
            if leased.taken_over:
                log.warning(
                    "split %d was taken over by another consumer after this consumer's lease lapsed; "
                    "its first %d rows were delivered here and will be delivered again there",
                    leased.split,
                    delivered,
                )
                del self._cursor.held[index]
            elif delivered == self._split_rows[leased.split]:
                self._ack(leased.split)  # delivered whole before the state was saved, ack unconfirmed
                del self._cursor.held[index]
            else:
                fetches.append(self._fetch(leased, reply.workers, delivered))
        return fetches

    def _start_lease(self, in_flight: collections.deque) -> tuple[concurrent.futures.Future, int]:
        """Asks for enough assignments to top the read-ahead up, in the background; (reply, how many)."""
        wanted = READ_AHEAD_SPLITS - len(in_flight)
        return self._control.submit(self._lease, self._cursor.next_index, wanted), wanted

    def _take_leases(self, reply, wanted: int, in_flight: collections.deque) -> tuple[bool, bool]:
        """Starts fetching the leased splits; returns (no split pending for now, end of epoch)."""
        for leased in reply.splits:
            self._cursor.next_index += 1
            if not leased.taken_over:
                self._cursor.held[leased.index] = 0
                in_flight.append(self._fetch(leased, reply.workers, 0))
        return len(reply.splits) < wanted, reply.end_of_epoch

    def batches(self) -> Iterator[Columns]:
        in_flight: collections.deque = collections.deque()
        leasing: tuple[concurrent.futures.Future, int] | None = None
        try:
            in_flight.extend(self._resumed())
            none_pending, end_of_epoch, idle = False, False, False
            while True:
                self._settle_acks()
                if leasing is None and len(in_flight) <= READ_AHEAD_SPLITS // 2 and not none_pending:
                    leasing = self._start_lease(in_flight)
                if leasing is not None and (leasing[0].done() or not in_flight):
                    none_pending, end_of_epoch = self._take_leases(leasing[0].result(), leasing[1], in_flight)
                    leasing = None
                if not in_flight:
                    yield from self._hand_out(iter([self._batcher.remainder()]))
                    self._settle_acks(wait=True)
                    if end_of_epoch:
                        return
                    if idle:  # other consumers hold the last splits; one may die and free its split
                        time.sleep(POLL_SECONDS)
                    none_pending, idle = False, True
                    continue
                idle = False
                index, fetched = in_flight.popleft()
                for block, positions in fetched.result():
                    self._batcher.add(index, block, positions)
                yield from self._hand_out(self._batcher.full_batches())
        finally:
            for _, fetched in in_flight:
                fetched.cancel()
            self._pool.shutdown(wait=True)
            self._control.shutdown(wait=True)


class Renewer:
    """Renews this consumer's leases while it reads (its heartbeat), a few times per lease term."""

    def __init__(self, connection: ServiceConnection, stub, job_id: int, consumer: str, lease_seconds: float) -> None:
        self._stop = threading.Event()
        every = max(0.1, (lease_seconds or 30.0) / 4)
        self._thread = threading.Thread(
            target=self._run, args=(connection, stub, job_id, consumer, every), name="snapfeed-renew", daemon=True
        )
        self._thread.start()

    def _run(self, connection: ServiceConnection, stub, job_id: int, consumer: str, every: float) -> None:
        while not self._stop.wait(every):
            try:
                stub.Renew(LeaseRequest(job_id=job_id, consumer=consumer), timeout=every, metadata=connection.metadata)
            except grpc.RpcError:
                continue

    def stop(self) -> None:
        """Returns once the thread is done with the channel (the caller closes it next)."""
        self._stop.set()
        self._thread.join()
