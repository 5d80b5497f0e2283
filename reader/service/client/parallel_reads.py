"""One parallel_epochs epoch as the consumer reads it (docs/architecture.md §5.5): every worker's whole epoch, interleaved.

Every worker streams the whole snapshot in its own seeded order
(``splits.worker_seed``), cut where the consumer cuts its batches, and the
consumer takes a record batch from each in turn (each row arrives once per
worker). A warm epoch opens its first worker's stream while its job request
is answered (``FirstWorkerStream``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator

import pyarrow as pa

from reader.core.allocator import Columns
from reader.service import splits
from reader.service.client.connection import ServiceConnection
from reader.service.client.cursor import Cursor
from reader.service.client.worker_clients import WorkerClients
from reader.service.delivery import DeliveryBatcher
from schemas.errors import ServiceUnavailableError, SnapfeedError
from schemas.service_pb2 import JobRequest, LeaseRequest

log = logging.getLogger(__name__)


class FirstWorkerStream:
    """The seed and workers the last epoch's job reply named, to open the next epoch's first stream by them.

    A warm epoch's first batch waited on a chain: the job request (a round
    trip to the dispatcher), then the first worker's stream (a round trip to
    it), the worker's gather of the batch, its transfer. A job's seed and live
    workers stay the same from epoch to epoch unless a worker joins or
    leaves, so ``parallel_batches`` opens the first worker's stream by the
    last reply while the dispatcher answers, and reads it only when the reply
    names the same seed and that worker still (then it sends the very rows
    the reply asks of it); otherwise it is cancelled, and the worker gathered
    one batch for nothing; the first batch comes sooner (docs/architecture.md §9.6).

    A ``ServiceSource`` holds one for the iterators it starts. Iterators
    reading at once may overwrite each other's: a guess gone wrong, which
    costs one cancelled stream.
    """

    def __init__(self) -> None:
        #: (seed, workers) of the last job reply, replaced whole; None: nothing to guess.
        self._last: tuple[int, list[str]] | None = None

    def remember(self, job) -> None:
        self._last = (job.seed, list(job.workers)) if job.workers else None

    def open(self, workers: WorkerClients, epoch: int, rows: int, batch_rows: int) -> _Opened | None:
        """The first worker's stream of ``epoch`` by the last reply, opened now; None without one, or when it failed.

        A worker that cannot serve it now is the job reply's path to report
        (its streams are opened again from the reply); here it only costs
        the head start.
        """
        if self._last is None:
            return None
        seed, last_workers = self._last
        worker = last_workers[0]
        try:
            stream = workers.stream_epoch(worker, splits.worker_seed(seed, worker), epoch, 0, rows, batch_rows)
        except (SnapfeedError, pa.ArrowException) as exc:
            log.debug("the stream of worker %s not opened ahead of the job reply: %s", worker, exc)
            return None
        return _Opened(seed, last_workers, stream)


@dataclasses.dataclass
class _Opened:
    """A first worker's stream opened by the last job reply's ``seed`` and ``workers``."""

    seed: int
    workers: list[str]
    stream: Iterator[Columns]

    def streams_for(self, job) -> dict[str, Iterator[Columns]]:
        """{worker: stream} when ``job`` asks that worker for these very rows; otherwise {} (the stream cancelled).

        A worker's rows depend only on the job's seed and its own address
        (``splits.worker_seed``), not on which other workers serve the job.
        """
        worker = self.workers[0]
        if job.seed == self.seed and worker in job.workers:
            return {worker: self.stream}
        self.stream.close()
        return {}


def parallel_batches(
    connection: ServiceConnection,
    workers: WorkerClients,
    rows: int,
    request: JobRequest,
    cursor: Cursor,
    batcher: DeliveryBatcher,
    first: FirstWorkerStream | None = None,
) -> Iterator[Columns]:
    """One parallel_epochs epoch of the job ``request`` names, from where ``cursor`` stands, as ``batcher`` cuts it.

    ``rows``: the snapshot's. ``first``: the last epoch's job reply, by which
    a warm epoch opens its first worker's stream while its own job request is
    answered; updated with this epoch's.
    """
    stub = connection.dispatcher()
    first = first or FirstWorkerStream()
    with contextlib.ExitStack() as closing:
        job_reply = connection.call_ahead(stub.GetJob, request)
        opened = None if cursor.held else first.open(workers, cursor.epoch, rows, batcher.batch_size)
        if opened is not None:
            closing.callback(opened.stream.close)  # until it is read to its end
        job = job_reply.result()
        first.remember(job)

        def streams_read() -> None:
            connection.call(stub.StreamsRead, LeaseRequest(job_id=job.job_id, consumer=cursor.consumer))

        ready = opened.streams_for(job) if opened is not None else {}
        yield from parallel_epoch(workers, connection.address, rows, job, cursor, batcher, streams_read, ready)


def parallel_epoch(
    workers: WorkerClients,
    address: str,
    rows: int,
    job,
    cursor: Cursor,
    batcher: DeliveryBatcher,
    streams_read: Callable[[], None],
    ready: dict[str, Iterator[Columns]],
) -> Iterator[Columns]:
    """Every worker's whole-epoch stream, interleaved; each resumes at the rows it already delivered.

    A worker streams in the order of its own seed (``splits.worker_seed``), in
    record batches of the consumer's batch size, taken in turn from each
    worker. ``ready``: streams already open, by worker; the others are opened
    when first read, so the epoch's first batch neither waits on their round
    trips nor shares the workers with their gathers. ``streams_read`` is
    called once every row was handed out (the dispatcher's ``status`` then
    shows the job finished when all its consumers got there).
    """
    if not job.workers:
        raise ServiceUnavailableError(f"the dispatcher at {address} has no live workers")
    streams = {}
    for worker in job.workers:
        seed = splits.worker_seed(job.seed, worker)
        offset = cursor.held.get(worker, 0)
        streams[worker] = ready.get(worker) or _opened_when_read(
            workers.stream_epoch, worker, seed, cursor.epoch, offset, rows, batcher.batch_size
        )
    while streams:
        for worker, stream in list(streams.items()):
            arrived = next(stream, None)
            if arrived is None:
                del streams[worker]
                continue
            batcher.add(worker, arrived)
            for batch, delivered in batcher.full_batches():
                cursor.deliver(delivered)
                yield batch
    batch, delivered = batcher.remainder()
    cursor.deliver(delivered)
    if batch is not None:
        yield batch
    streams_read()


def _opened_when_read(open_stream: Callable[..., Iterator[Columns]], *args) -> Iterator[Columns]:
    yield from open_stream(*args)
