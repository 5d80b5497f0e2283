"""Arrow Flight clients of the workers, one connection per worker shared by a source's iterators and epochs.

Tickets are JSON naming the snapshot (an absolute path or a URI), the run the
consumer planned from, the columns, whether to check shards' CRC32C first
(``verify_checksums=True``) and what to stream: nothing executable travels to
a worker. A worker that no longer has that run refuses it
(``protocol.ReplacedRunError``) instead of streaming another run's rows.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterator

import pyarrow.flight as flight

from reader.core.allocator import Columns
from reader.service.client.connection import ServiceConnection
from reader.service.protocol import DISTRIBUTED, PARALLEL, REPLACED_RUN, STREAM_FORMAT, ReplacedRunError
from reader.service.splits import SplitOrder
from schemas import columns
from schemas.errors import ServiceUnavailableError, SnapfeedError, UsageError


class WorkerClients:
    """A consumer's connections to the workers, and the two ways it reads from them."""

    def __init__(
        self,
        connection: ServiceConnection,
        snapshot_path: str,
        run_id: str,
        column_names: list[str],
        verify_checksums: bool | str = False,
        mixture: str | None = None,
    ) -> None:
        """``verify_checksums``: what the workers check before sending (``ReaderOptions.verify_checksums``);
        ``mixture``: a mixture job's definition (``mixture_jobs.MixtureJob`` as JSON), whose splits are windows."""
        self._connection = connection
        self._mixture = mixture
        self._snapshot_path = snapshot_path
        self._run_id = run_id
        self._columns = column_names
        self._verify = verify_checksums
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def _ticket(self, **fields) -> flight.Ticket:
        payload = {"snapshot": self._snapshot_path, "run_id": self._run_id, "columns": self._columns, **fields}
        if self._verify:
            payload["verify_checksums"] = self._verify  # True (whole shards) or "blocks"
        if self._mixture:
            payload["mixture"] = self._mixture
        return flight.Ticket(json.dumps(payload).encode())

    def _client(self, worker: str) -> flight.FlightClient:
        """One Flight connection per worker, reused across splits and iterators (connecting per split dominated)."""
        with self._lock:
            if worker not in self._clients:
                self._clients[worker] = self._connection.flight_client(worker)
            return self._clients[worker]

    def _forget(self, worker: str) -> None:
        """Drops a failed worker's connection; the next fetch reconnects.

        Not closed here: other iterators (per-context copies) may still be using it (their calls
        fail over on their own); it closes when the last of them lets go.
        """
        with self._lock:
            self._clients.pop(worker, None)

    def stream_split(self, read: SplitRead) -> Iterator[Columns]:
        """The split's rows still needed after ``read.offset`` rows delivered, each record batch as soon as it arrived.

        The stream is opened before this returns (a worker asked, and
        answering), so the worker gathers and sends while the consumer still
        reads earlier splits. Rows come in delivery order, in record batches
        cut as ``read.cut`` says. Splits go round-robin over the workers. A
        worker failing mid-split is replaced by the next one, asked for the
        rows after those already received (never again for a record batch
        already yielded: each row arrives once). When none answers, the live
        workers are asked again from the dispatcher (a worker may be
        restarting, or the dispatcher just restarted), for up to
        ``ServiceOptions.timeout_seconds``.
        """
        batches = self._split_batches(read)
        next(batches)  # runs up to the first worker's answer (see _split_batches)
        return batches

    def _split_batches(self, read: SplitRead) -> Iterator[Columns | None]:
        """``stream_split``'s batches, after one None yielded once the first worker accepted the stream."""
        failures: list[str] = []
        outage = None
        opened = False
        split, workers = read.split, read.workers
        rows = read.order.split_rows(split) - read.offset
        received = 0
        while True:
            first = split % max(1, len(workers))
            for worker in workers[first:] + workers[:first]:
                ticket = self._ticket(
                    mode=DISTRIBUTED,
                    seed=read.seed,
                    iteration=read.epoch,
                    split=split,
                    offset=read.offset + received,
                    **read.cut.after(received).fields(),
                )
                try:
                    reader = self._client(worker).do_get(ticket, self._connection.flight_options)
                    if not opened:
                        opened = True
                        try:
                            yield None
                        except GeneratorExit:  # closed before reading: the shared connection stays open
                            reader.cancel()
                            raise
                    for batch in _batches_from(reader, rows - received, f"split {split} from worker {worker}"):
                        received += _rows(batch)
                        yield batch
                    return
                except (flight.FlightUnauthorizedError, flight.FlightUnauthenticatedError) as exc:
                    raise UsageError(f"worker {worker} refused {self._snapshot_path}: {exc}") from exc
                except flight.FlightServerError as exc:
                    raise _refusal(exc, worker) from exc
                except _WORKER_GONE as exc:
                    failures.append(f"{worker}: {type(exc).__name__}")
                    self._forget(worker)
                    if read.expected and not opened:
                        raise ServiceUnavailableError(f"split {split} from worker {worker}: {exc}") from exc
            if read.expected and not opened:
                raise ServiceUnavailableError(f"split {split}: no worker to ask")
            outage = outage or self._connection.outage(f"every worker for split {split} of {self._snapshot_path}")
            outage.retry_or_raise(
                ", ".join(failures[-4:]) or "no live workers", "Check that workers run and reach the dispatcher."
            )
            workers = read.refresh()

    def stream_epoch(
        self, worker: str, seed: int, epoch: int, offset: int, rows: int, batch_rows: int
    ) -> Iterator[Columns]:
        """parallel_epochs: the worker's whole epoch (``rows`` rows) from row ``offset``, in batches of ``batch_rows``.

        ``seed`` is the worker's own (``splits.worker_seed``). The stream is
        opened before this returns (the worker asked, and answering), so it
        gathers while the consumer does other things. No deadline: the stream
        lasts the epoch, at the consumer's pace.
        """
        batches = self._epoch_batches(worker, seed, epoch, offset, rows, batch_rows)
        next(batches)  # runs up to the worker's answer (see _epoch_batches)
        return batches

    def _epoch_batches(
        self, worker: str, seed: int, epoch: int, offset: int, rows: int, batch_rows: int
    ) -> Iterator[Columns | None]:
        """``stream_epoch``'s batches, after one None yielded once the worker accepted the stream."""
        ticket = self._ticket(mode=PARALLEL, seed=seed, iteration=epoch, offset=offset, **Cut(batch_rows).fields())
        try:
            reader = self._client(worker).do_get(ticket, self._connection.stream_options)
            try:
                yield None
            except GeneratorExit:  # closed before reading: the shared connection stays open
                reader.cancel()
                raise
            yield from _batches_from(reader, rows - offset, f"the stream of worker {worker}")
        except flight.FlightServerError as exc:
            raise _refusal(exc, worker) from exc


@dataclasses.dataclass(frozen=True)
class SplitRead:
    """One split of a distributed_epoch job to stream (``WorkerClients.stream_split``).

    ``workers``: whom to ask, in turn; ``refresh``: the live workers from the
    dispatcher, when none of them answers; ``order``: the job's splits in this epoch (``SplitOrder``);
    ``offset``: rows of the split already delivered; ``cut``: where the
    consumer cuts its batches. ``expected``: asked before its lease
    (``read_ahead.open_expected``), so only its first worker is asked before
    the stream is open, and a failure there is given up, not retried; once
    open, it fails over like any split.
    """

    workers: list[str]
    refresh: Callable[[], list[str]]
    order: SplitOrder
    seed: int
    epoch: int
    split: int
    offset: int
    cut: Cut
    expected: bool = False

    def same_rows(self, other: SplitRead) -> bool:
        """Whether both streams send the same rows cut the same way (the seed and epoch order the blocks)."""
        fields = ("seed", "epoch", "split", "offset", "cut")
        return all(getattr(self, name) == getattr(other, name) for name in fields)


@dataclasses.dataclass(frozen=True)
class Cut:
    """Where the consumer cuts its batches in a stream: after ``head`` rows (0: none), then every ``batch_rows``.

    Sent to the worker, which cuts its record batches there, so a batch that
    arrives whole is handed out as it arrived (``DeliveryBatcher``: a view, no
    copy). Only the cost depends on it: any cut delivers the same rows.
    """

    batch_rows: int
    head: int = 0

    def after(self, rows: int) -> Cut:
        """The same cut for the rest of the stream, once its first ``rows`` rows arrived."""
        return Cut(self.batch_rows, (self.head - rows) % self.batch_rows)

    def fields(self) -> dict:
        return {"batch_rows": self.batch_rows, "head": self.head}


class EndedShortError(ServiceUnavailableError):
    """A worker's stream ended before the rows it owed (the worker stopped): asked of another worker."""


#: What a worker that stopped, restarted or is unreachable raises; the split is asked of another one.
_WORKER_GONE = (
    EndedShortError,
    flight.FlightUnavailableError,
    flight.FlightCancelledError,  # a stopping worker cancels calls it has not started
    flight.FlightInternalError,
    flight.FlightTimedOutError,
    OSError,
)


def _rows(batch: Columns) -> int:
    return len(next(iter(batch.values())))


def _batches_from(reader: flight.FlightStreamReader, rows: int, what: str) -> Iterator[Columns]:
    """The stream's ``rows`` rows, a record batch at a time as they arrive (zero-copy NumPy views).

    A stream that sends rows another way (a worker of another snapfeed
    version), more rows or fewer is an error, never rows delivered wrong.
    Closed early (the consumer stopped reading), the stream is cancelled: the
    connection is shared and stays open, so the worker must be told to stop.
    """
    try:
        yield from _checked_batches(reader, rows, what)
    except GeneratorExit:
        reader.cancel()
        raise


def _checked_batches(reader: flight.FlightStreamReader, rows: int, what: str) -> Iterator[Columns]:
    if (reader.schema.metadata or {}) != STREAM_FORMAT:
        raise UsageError(
            f"{what}: the worker sends rows another way than this consumer reads them (another snapfeed "
            "version); run the same snapfeed version on the workers and their consumers"
        )
    received = 0
    while received < rows:
        try:
            batch = reader.read_chunk().data
        except StopIteration:
            raise EndedShortError(f"{what} ended {rows - received} rows short") from None
        received += batch.num_rows
        if received > rows:
            raise ServiceUnavailableError(f"{what} sent {received - rows} rows more than expected")
        yield columns.batch_to_numpy(batch)
    try:
        extra = reader.read_chunk().data.num_rows
    except StopIteration:
        return
    raise ServiceUnavailableError(f"{what} sent {extra} rows more than expected")


def _refusal(exc: flight.FlightServerError, worker: str) -> Exception:
    """What a worker's error means to the consumer: a replaced run, or the worker's own message."""
    message = str(exc).split(". Detail:")[0]
    if exc.extra_info == REPLACED_RUN:
        return ReplacedRunError(f"worker {worker}: {message}")
    return SnapfeedError(f"worker {worker} failed: {message}")
