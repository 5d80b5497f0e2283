"""The consumer side of the reader service, behind ``reader.distributed_dataset(service=...)``.

distributed_epoch: lease a split from the dispatcher, stream its rows from a
worker over Arrow Flight, acknowledge it once every row arrived, repeat until
the dispatcher says the epoch is over. If the worker fails mid-split, the
remaining rows (from the received offset) come from another worker, so each
row is delivered exactly once. A heartbeat thread renews the consumer's leases.

parallel_epochs: every worker streams the whole snapshot, shuffled its own way;
the consumer interleaves them (each row arrives once per worker).

Rows are then batched and split across replicas exactly as the local reader does.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pyarrow.flight as flight

from reader.adapters import step_adapter
from reader.blocks import Columns
from reader.options import ReaderOptions
from reader.plan import replica_ranges
from reader.service.auth import bearer
from reader.service.dispatch_state import PROCESSING_MODES
from reader.service.rpc import DispatcherStub
from reader.snapshot import Snapshot
from schemas import columns
from schemas.errors import SnapfeedError, UsageError
from schemas.service_pb2 import AckRequest, JobRequest, LeaseRequest

RPC_TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 0.05
NO_WORKER_WAIT_SECONDS = 30.0
#: How long a consumer keeps retrying an unreachable dispatcher (a restart with --work_dir resumes the job).
DISPATCHER_RETRY_SECONDS = 60.0


class ServiceUnavailableError(SnapfeedError, ConnectionError):
    """The dispatcher or every worker cannot be reached."""


def _call(method, request, address: str, metadata: list[tuple[str, str]]):
    """A dispatcher call with a deadline, retried while the dispatcher is unreachable (restarting)."""
    deadline = time.monotonic() + DISPATCHER_RETRY_SECONDS
    while True:
        try:
            return method(request, timeout=RPC_TIMEOUT_SECONDS, metadata=metadata)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise _rpc_error(exc, address) from exc
            time.sleep(0.2)


def _concat(parts: list[Columns]) -> Columns:
    if len(parts) == 1:
        return parts[0]
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def batches(blocks: Iterator[Columns], batch_size: int, *, drop_remainder: bool) -> Iterator[Columns]:
    """Re-cuts a stream of row blocks into batches of ``batch_size`` (the last one partial unless dropped)."""
    pending: list[Columns] = []
    count = 0
    for block in blocks:
        rows = len(next(iter(block.values())))
        if not rows:
            continue
        pending.append(block)
        count += rows
        while count >= batch_size:
            merged = _concat(pending)
            yield {name: values[:batch_size] for name, values in merged.items()}
            pending = [{name: values[batch_size:] for name, values in merged.items()}] if count > batch_size else []
            count -= batch_size
    if count and not drop_remainder:
        yield _concat(pending)


class ServiceDataset:
    """Iterating yields steps like ``DistributedDataset``: a batch per local replica."""

    def __init__(
        self,
        snapshot: Snapshot,
        options: ReaderOptions,
        *,
        service: str,
        processing_mode: str,
        job_name: str | None,
        map_fn: Callable | None = None,
        auth_token: str | None = None,
    ) -> None:
        if processing_mode not in PROCESSING_MODES:
            raise UsageError(f"processing_mode={processing_mode!r}; choose one of {', '.join(PROCESSING_MODES)}")
        if not service.startswith("grpc://"):
            raise UsageError(f"service={service!r}; give the dispatcher as grpc://host:port")
        self.snapshot = snapshot
        self.options = options
        self._address = service.removeprefix("grpc://")
        self._metadata = bearer(auth_token)
        self._flight_headers = [(k.encode(), v.encode()) for k, v in self._metadata]
        self._clients: dict[str, flight.FlightClient] = {}
        self._mode = processing_mode
        self._job_name = job_name or f"anonymous-{uuid.uuid4().hex}"
        self._columns = list(options.columns) if options.columns else [c.name for c in snapshot.metadata.columns]
        self._seed = options.seed if options.seed is not None else int(uuid.uuid4().int % (2**62))
        self._adapt = step_adapter(options.output, map_fn)
        self._iterations = itertools.count()
        self.element_spec = {name: snapshot.element_spec[name] for name in self._columns}
        self.steps_per_epoch = None  # depends on which splits this consumer wins

    def __iter__(self):
        first = next(self._iterations) * (self.options.num_epochs or 0)
        epochs = (
            itertools.count(first) if self.options.num_epochs is None else range(first, first + self.options.num_epochs)
        )
        return (self._adapt(step) for epoch in epochs for step in self._steps(epoch))

    def _steps(self, epoch: int) -> Iterator[list[Columns]]:
        context = self.options.context
        per_pipeline = self.options.global_batch_size // context.num_input_pipelines
        for batch in batches(self._epoch_blocks(epoch), per_pipeline, drop_remainder=self.options.drop_remainder):
            rows = len(next(iter(batch.values())))
            yield [
                {name: values[lo:hi] for name, values in batch.items()}
                for lo, hi in replica_ranges(rows, context.replicas_per_pipeline)
            ]

    def _epoch_blocks(self, epoch: int) -> Iterator[Columns]:
        consumer = f"{self._job_name}/{uuid.uuid4().hex[:12]}"
        with grpc.insecure_channel(self._address) as channel:
            stub = DispatcherStub(channel)
            request = JobRequest(
                job_name=self._job_name,
                iteration=epoch,
                snapshot=self.snapshot.path,
                processing_mode=self._mode,
                consumer=consumer,
                seed=self._seed,
            )
            job = _call(stub.GetJob, request, self._address, self._metadata)
            if self._mode == "parallel_epochs":
                yield from self._parallel(job, epoch)
                return
            renewer = _Renewer(stub, job.job_id, consumer, self._metadata)
            try:
                yield from self._distributed(stub, request, job, epoch, consumer)
            finally:
                renewer.stop()

    def _ticket(self, **fields) -> flight.Ticket:
        return flight.Ticket(json.dumps({"snapshot": self.snapshot.path, "columns": self._columns, **fields}).encode())

    def _distributed(
        self, stub: DispatcherStub, request: JobRequest, job, epoch: int, consumer: str
    ) -> Iterator[Columns]:
        def refresh() -> list[str]:
            return list(_call(stub.GetJob, request, self._address, self._metadata).workers)

        while True:
            lease = _call(
                stub.LeaseSplit, LeaseRequest(job_id=job.job_id, consumer=consumer), self._address, self._metadata
            )
            if not lease.has_split:
                if lease.end_of_epoch:
                    return
                time.sleep(POLL_SECONDS)  # other consumers hold the last splits; one may die and free its split
                continue
            yield from self._fetch_split(list(lease.workers), refresh, job.seed, epoch, lease.split)
            _call(
                stub.AckSplit,
                AckRequest(job_id=job.job_id, split=lease.split, consumer=consumer),
                self._address,
                self._metadata,
            )

    def _client(self, worker: str) -> flight.FlightClient:
        """One Flight connection per worker, reused across splits (connecting per split dominated)."""
        if worker not in self._clients:
            self._clients[worker] = flight.connect(worker)
        return self._clients[worker]

    def _forget(self, worker: str) -> None:
        client = self._clients.pop(worker, None)
        if client is not None:
            client.close()

    def _fetch_split(
        self, workers: list[str], refresh: Callable[[], list[str]], seed: int, epoch: int, split: int
    ) -> Iterator[Columns]:
        """The split's rows, resumed at the received offset on another worker when one fails.

        When no listed worker answers, the live workers are asked again from the
        dispatcher (a worker may be restarting, or the dispatcher just restarted).
        """
        received, failures = 0, []
        deadline = time.monotonic() + NO_WORKER_WAIT_SECONDS
        while True:
            for worker in workers:
                ticket = self._ticket(
                    mode="distributed_epoch", seed=seed, iteration=epoch, split=split, offset=received
                )
                try:
                    options = flight.FlightCallOptions(headers=self._flight_headers, timeout=RPC_TIMEOUT_SECONDS)
                    for chunk in self._client(worker).do_get(ticket, options):
                        block = columns.batch_to_numpy(chunk.data)
                        received += chunk.data.num_rows
                        yield block
                    return
                except (flight.FlightUnauthorizedError, flight.FlightUnauthenticatedError) as exc:
                    raise UsageError(f"worker {worker} refused {self.snapshot.path}: {exc}") from exc
                except (
                    flight.FlightUnavailableError,
                    flight.FlightInternalError,
                    flight.FlightTimedOutError,
                    OSError,
                ) as exc:
                    failures.append(f"{worker}: {type(exc).__name__}")
                    self._forget(worker)
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"no worker could serve split {split} of {self.snapshot.path} within {NO_WORKER_WAIT_SECONDS:.0f} s: "
                    f"{failures[-4:] or 'no live workers'}"
                )
            time.sleep(0.2)
            workers = refresh()

    def _parallel(self, job, epoch: int) -> Iterator[Columns]:
        if not job.workers:
            raise ServiceUnavailableError(f"the dispatcher at {self._address} has no live workers")
        streams = []
        for worker in job.workers:
            client = flight.connect(worker)
            streams.append(
                (client, iter(client.do_get(self._ticket(mode="parallel_epochs", seed=job.seed, iteration=epoch))))
            )
        try:
            while streams:
                for entry in list(streams):
                    try:
                        chunk = next(entry[1])
                    except StopIteration:
                        streams.remove(entry)
                        continue
                    yield columns.batch_to_numpy(chunk.data)
        finally:
            for client, _ in streams:
                client.close()


class _Renewer:
    """Renews this consumer's leases while it reads (its heartbeat)."""

    def __init__(self, stub: DispatcherStub, job_id: int, consumer: str, metadata, every: float = 2.0) -> None:
        self._stop = threading.Event()
        args = (stub, job_id, consumer, metadata, every)
        self._thread = threading.Thread(target=self._run, args=args, daemon=True)
        self._thread.start()

    def _run(self, stub, job_id: int, consumer: str, metadata, every: float) -> None:
        while not self._stop.wait(every):
            try:
                stub.Renew(LeaseRequest(job_id=job_id, consumer=consumer), timeout=every, metadata=metadata)
            except grpc.RpcError:
                continue

    def stop(self) -> None:
        self._stop.set()


def _rpc_error(exc: grpc.RpcError, address: str) -> SnapfeedError:
    code = exc.code() if hasattr(exc, "code") else None
    if code == grpc.StatusCode.UNAVAILABLE:
        return ServiceUnavailableError(f"the dispatcher at grpc://{address} is unreachable: {exc.details()}")
    if code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNAUTHENTICATED,
    ):
        return UsageError(f"the dispatcher at grpc://{address} refused: {exc.details()}")
    return SnapfeedError(f"the dispatcher at grpc://{address} failed: {code} {exc.details() if code else exc}")
