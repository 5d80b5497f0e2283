"""Arrow Flight clients of the workers, one connection per worker shared by a consumer's epochs and fetch threads.

Tickets are JSON naming the snapshot (an absolute path or a URI), the run the
consumer planned from, the columns and what to stream: nothing executable
travels to a worker. A worker that no longer has that run refuses it
(``runs.ReplacedRunError``) instead of streaming another run's rows.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from reader.blocks import Columns
from reader.plan import Piece
from reader.service import runs, splits
from reader.service.connection import ServiceConnection, ServiceUnavailableError
from reader.service.dispatch_state import DISTRIBUTED, PARALLEL
from schemas import columns
from schemas.errors import SnapfeedError, UsageError


class WorkerClients:
    """A consumer's connections to the workers, and the two ways it reads from them."""

    def __init__(self, connection: ServiceConnection, snapshot_path: str, run_id: str, column_names: list[str]) -> None:
        self._connection = connection
        self._snapshot_path = snapshot_path
        self._run_id = run_id
        self._columns = column_names
        self._clients: dict[str, flight.FlightClient] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()

    def _ticket(self, **fields) -> flight.Ticket:
        payload = {"snapshot": self._snapshot_path, "run_id": self._run_id, "columns": self._columns, **fields}
        return flight.Ticket(json.dumps(payload).encode())

    def _client(self, worker: str) -> flight.FlightClient:
        """One Flight connection per worker, reused across splits and fetch threads (connecting per split dominated)."""
        with self._lock:
            if worker not in self._clients:
                self._clients[worker] = self._connection.flight_client(worker)
            return self._clients[worker]

    def _forget(self, worker: str) -> None:
        """Drops a failed worker's connection; the next fetch reconnects.

        Not closed here: other fetch threads may still be using it (their calls
        fail over on their own); it closes when the last of them lets go.
        """
        with self._lock:
            self._clients.pop(worker, None)

    def stream_split(
        self,
        workers: list[str],
        refresh: Callable[[], list[str]],
        blocks: list[Piece],
        seed: int,
        epoch: int,
        split: int,
        offset: int,
    ) -> Iterator[tuple[Columns, splits.SplitPart]]:
        """The split's blocks still needed after ``offset`` rows delivered, each as soon as it arrived.

        ``blocks`` is the job's block order. Splits go round-robin over the
        workers. A worker failing mid-split is replaced by the next one, asked
        for the rows after those already received (never again for a block
        already yielded: each row arrives once). When none answers, the live
        workers are asked again from the dispatcher (a worker may be
        restarting, or the dispatcher just restarted), for up to
        ``service_timeout_seconds``.
        """
        failures: list[str] = []
        outage = None
        received = offset
        while True:
            first = split % max(1, len(workers))
            for worker in workers[first:] + workers[:first]:
                ticket = self._ticket(mode=DISTRIBUTED, seed=seed, iteration=epoch, split=split, offset=received)
                parts = splits.remaining_parts(blocks, seed, epoch, split, received)
                try:
                    reader = self._client(worker).do_get(ticket, self._connection.flight_options)
                    for block, part in _parts_from(reader, parts, f"split {split} from worker {worker}"):
                        received += len(part.order)
                        yield block, part
                    return
                except (flight.FlightUnauthorizedError, flight.FlightUnauthenticatedError) as exc:
                    raise UsageError(f"worker {worker} refused {self._snapshot_path}: {exc}") from exc
                except flight.FlightServerError as exc:
                    raise _refusal(exc, worker) from exc
                except _WORKER_GONE as exc:
                    failures.append(f"{worker}: {type(exc).__name__}")
                    self._forget(worker)
            outage = outage or self._connection.outage(f"every worker for split {split} of {self._snapshot_path}")
            outage.retry_or_raise(
                ", ".join(failures[-4:]) or "no live workers", "Check that workers run and reach the dispatcher."
            )
            workers = refresh()

    def stream_epoch(
        self, worker: str, seed: int, epoch: int, offset: int, blocks: list[Piece]
    ) -> Iterator[tuple[Columns, splits.SplitPart]]:
        """parallel_epochs: the worker's whole epoch from row ``offset``, block by block as stored.

        ``seed`` is the worker's own (``splits.worker_seed``) and ``blocks`` its
        block order (``splits.job_blocks`` of that seed). No deadline: the
        stream lasts the epoch, at the consumer's pace.
        """
        ticket = self._ticket(mode=PARALLEL, seed=seed, iteration=epoch, offset=offset)
        parts = splits.stream_parts(blocks, 0, seed, epoch, offset)
        try:
            reader = self._client(worker).do_get(ticket, self._connection.stream_options)
            yield from _parts_from(reader, parts, f"the stream of worker {worker}")
        except flight.FlightServerError as exc:
            raise _refusal(exc, worker) from exc


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


def _parts_from(
    reader: flight.FlightStreamReader, parts: Iterable[splits.SplitPart], what: str
) -> Iterator[tuple[Columns, splits.SplitPart]]:
    """Each part's rows as the worker sent them (``SplitPart.sent_rows``), read off the stream as they arrive.

    A worker sends one record batch per part; a batch arriving in pieces is
    put back together. A stream that does not match the parts (a worker
    serving something else) is an error, not rows delivered wrong. Closed
    early (the consumer stopped reading), the stream is cancelled: the
    connection is shared and stays open, so the worker must be told to stop.
    """
    try:
        yield from _checked_parts(reader, parts, what)
    except GeneratorExit:
        reader.cancel()
        raise


def _checked_parts(
    reader: flight.FlightStreamReader, parts: Iterable[splits.SplitPart], what: str
) -> Iterator[tuple[Columns, splits.SplitPart]]:
    for part in parts:
        expected, received, pieces = len(part.order), 0, []
        while received < expected:
            try:
                piece = reader.read_chunk().data
            except StopIteration:
                raise EndedShortError(f"{what} ended {expected - received} rows short of a block") from None
            pieces.append(piece)
            received += piece.num_rows
        if received != expected:
            raise ServiceUnavailableError(f"{what} sent a block of {received} rows, {expected} were expected")
        yield columns.batch_to_numpy(_one_batch(pieces)), part
    try:
        extra = reader.read_chunk().data.num_rows
    except StopIteration:
        return
    raise ServiceUnavailableError(f"{what} sent {extra} rows more than expected")


def _one_batch(pieces: list[pa.RecordBatch]) -> pa.RecordBatch:
    """The record batches of one block as one (the batch itself when it came whole)."""
    if len(pieces) == 1:
        return pieces[0]
    return pa.Table.from_batches(pieces).combine_chunks().to_batches()[0]


def _refusal(exc: flight.FlightServerError, worker: str) -> Exception:
    """What a worker's error means to the consumer: a replaced run, or the worker's own message."""
    message = str(exc).split(". Detail:")[0]
    if exc.extra_info == runs.REPLACED_RUN:
        return runs.ReplacedRunError(f"worker {worker}: {message}")
    return SnapfeedError(f"worker {worker} failed: {message}")
