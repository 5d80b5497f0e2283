"""One epoch of a service job as the consumer reads it (DESIGN §5), and where it stands (``Cursor``).

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
from collections.abc import Iterator

import grpc

from reader.blocks import Columns
from reader.service import splits
from reader.service.connection import ServiceConnection, ServiceUnavailableError
from reader.service.delivery import Delivered, DeliveryBatcher
from reader.service.worker_clients import WorkerClients
from schemas.errors import UsageError
from schemas.service_pb2 import AckRequest, JobRequest, LeaseRequest

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05
#: Leased splits fetched concurrently ahead of the batcher (each about one 1 MiB block).
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


def parallel_epoch(
    workers: WorkerClients, address: str, job, cursor: Cursor, batcher: DeliveryBatcher
) -> Iterator[Columns]:
    """Every worker's whole-epoch stream, interleaved; each resumes at the rows it already delivered."""
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
    cut, always consumed in assignment order so a restore repeats the order.
    A split is acknowledged when all its rows were delivered in batches. When
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
        pieces = splits.job_splits(block_rows, job.seed, request.iteration)
        self._split_rows = [piece.rows for piece in pieces]
        self._split_of: dict[int, int] = {}

    def _lease(self, index: int):
        return self._call(
            self._stub.LeaseSplit, LeaseRequest(job_id=self._job.job_id, consumer=self._cursor.consumer, index=index)
        )

    def _refresh_workers(self) -> list[str]:
        return list(self._call(self._stub.GetJob, self._request).workers)

    def _fetch(self, pool: concurrent.futures.Executor, lease, offset: int) -> tuple[int, concurrent.futures.Future]:
        self._split_of[lease.index] = lease.split
        args = (
            list(lease.workers),
            self._refresh_workers,
            self._job.seed,
            self._request.iteration,
            lease.split,
            offset,
        )
        return lease.index, pool.submit(self._workers.fetch_split, *args)

    def _hand_out(self, cut: Iterator[tuple[Columns, Delivered]]) -> Iterator[Columns]:
        for batch, delivered in cut:
            self._deliver(delivered)
            if batch is not None:
                yield batch

    def _deliver(self, delivered: Delivered) -> None:
        """Counts delivered rows and acknowledges every split whose rows were all delivered."""
        self._cursor.deliver(delivered)
        for index, _ in delivered:
            split = self._split_of[index]
            if self._cursor.held[index] == self._split_rows[split]:
                self._ack(split)
                del self._cursor.held[index]

    def _ack(self, split: int) -> None:
        try:
            self._call(
                self._stub.AckSplit, AckRequest(job_id=self._job.job_id, split=split, consumer=self._cursor.consumer)
            )
        except UsageError as exc:
            log.warning("split %d was delivered here and by another consumer (this one's lease lapsed): %s", split, exc)

    def _resumed(self, pool) -> list[tuple[int, concurrent.futures.Future]]:
        """Fetches of the assignments a restored cursor held, from the rows it had delivered."""
        fetches = []
        for index, delivered in list(self._cursor.held.items()):
            lease = self._lease(index)
            if lease.taken_over:
                log.warning(
                    "split %d was taken over by another consumer after this consumer's lease lapsed; "
                    "its first %d rows were delivered here and will be delivered again there",
                    lease.split,
                    delivered,
                )
                del self._cursor.held[index]
            else:
                fetches.append(self._fetch(pool, lease, delivered))
        return fetches

    def batches(self) -> Iterator[Columns]:
        cursor = self._cursor
        with concurrent.futures.ThreadPoolExecutor(READ_AHEAD_SPLITS, "snapfeed-fetch") as pool:
            in_flight = collections.deque(self._resumed(pool))
            end_of_epoch = False
            try:
                while True:
                    while len(in_flight) < READ_AHEAD_SPLITS:
                        lease = self._lease(cursor.next_index)
                        if not lease.has_split:
                            end_of_epoch = lease.end_of_epoch
                            break
                        cursor.next_index += 1
                        if not lease.taken_over:
                            cursor.held[lease.index] = 0
                            in_flight.append(self._fetch(pool, lease, 0))
                    if not in_flight:
                        yield from self._hand_out(iter([self._batcher.remainder()]))
                        if end_of_epoch:
                            return
                        time.sleep(POLL_SECONDS)  # other consumers hold the last splits; one may die and free it
                        continue
                    index, fetched = in_flight.popleft()
                    for block in fetched.result():
                        self._batcher.add(index, block)
                    yield from self._hand_out(self._batcher.full_batches())
            finally:
                for _, fetched in in_flight:
                    fetched.cancel()


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
