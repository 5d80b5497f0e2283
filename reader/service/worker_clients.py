"""Arrow Flight clients of the workers, one connection per worker shared by a consumer's fetch threads.

Tickets are JSON naming the snapshot (an absolute path or a URI), the run the
consumer planned from, the columns and what to stream: nothing executable
travels to a worker. A worker that no longer has that run refuses it
(``runs.ReplacedRunError``) instead of streaming another run's rows.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from reader.blocks import Columns
from reader.service import runs
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

    def fetch_split(
        self,
        workers: list[str],
        refresh: Callable[[], list[str]],
        seed: int,
        epoch: int,
        split: int,
        offset: int,
        block_rows: list[int],
    ) -> list[Columns]:
        """The split's rows still needed after ``offset`` delivered, one array set per block of ``block_rows`` rows.

        Each block's rows come in stored order (``splits.SplitPart.sent_rows``).
        The split is read whole (a few MiB), so no stream stays open. Splits go
        round-robin over the workers; a worker failing mid-split is simply asked
        of the next one. When none answers, the live workers are asked again from
        the dispatcher (a worker may be restarting, or the dispatcher just restarted),
        for up to ``service_timeout_seconds``.
        """
        failures: list[str] = []
        outage = None
        ticket = self._ticket(mode=DISTRIBUTED, seed=seed, iteration=epoch, split=split, offset=offset)
        while True:
            first = split % max(1, len(workers))
            for worker in workers[first:] + workers[:first]:
                try:
                    table = self._client(worker).do_get(ticket, self._connection.flight_options).read_all()
                    return _blocks_of(table, block_rows, f"split {split} from worker {worker}")
                except (flight.FlightUnauthorizedError, flight.FlightUnauthenticatedError) as exc:
                    raise UsageError(f"worker {worker} refused {self._snapshot_path}: {exc}") from exc
                except flight.FlightServerError as exc:
                    raise _refusal(exc, worker) from exc
                except (
                    flight.FlightUnavailableError,
                    flight.FlightCancelledError,  # a stopping worker cancels calls it has not started
                    flight.FlightInternalError,
                    flight.FlightTimedOutError,
                    OSError,
                ) as exc:
                    failures.append(f"{worker}: {type(exc).__name__}")
                    self._forget(worker)
            outage = outage or self._connection.outage(f"every worker for split {split} of {self._snapshot_path}")
            outage.retry_or_raise(
                ", ".join(failures[-4:]) or "no live workers", "Check that workers run and reach the dispatcher."
            )
            workers = refresh()

    def stream_epoch(self, worker: str, seed: int, epoch: int, offset: int) -> Iterator[Columns]:
        """parallel_epochs: the worker's whole shuffled epoch from row ``offset`` (no deadline: it lasts the epoch)."""
        ticket = self._ticket(mode=PARALLEL, seed=seed, iteration=epoch, offset=offset)
        try:
            for chunk in self._client(worker).do_get(ticket, self._connection.stream_options):
                yield columns.batch_to_numpy(chunk.data)
        except flight.FlightServerError as exc:
            raise _refusal(exc, worker) from exc


def _refusal(exc: flight.FlightServerError, worker: str) -> Exception:
    """What a worker's error means to the consumer: a replaced run, or the worker's own message."""
    message = str(exc).split(". Detail:")[0]
    if exc.extra_info == runs.REPLACED_RUN:
        return runs.ReplacedRunError(f"worker {worker}: {message}")
    return SnapfeedError(f"worker {worker} failed: {message}")


def _blocks_of(table: pa.Table, block_rows: list[int], what: str) -> list[Columns]:
    """The table cut into blocks of ``block_rows`` rows, as NumPy (views when a block is one record batch)."""
    if table.num_rows != sum(block_rows):
        raise ServiceUnavailableError(f"{what} has {table.num_rows} rows, {sum(block_rows)} were expected")
    blocks, start = [], 0
    for rows in block_rows:
        batches = table.slice(start, rows).to_batches()
        batch = batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
        blocks.append(columns.batch_to_numpy(batch))
        start += rows
    return blocks
