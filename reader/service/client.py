"""The consumer side of the reader service, behind ``reader.distributed_dataset(service=...)``.

distributed_epoch: lease a split from the dispatcher, stream its rows from a
worker over Arrow Flight, acknowledge it once every row was delivered in a
step, repeat until the dispatcher says the epoch is over. If the worker fails
mid-split, the remaining rows (from the received offset) come from another
worker, so each row is delivered exactly once. A heartbeat thread renews the
consumer's leases.

parallel_epochs: every worker streams the whole snapshot, shuffled its own way;
the consumer interleaves them (each row arrives once per worker).

Rows are then batched and split across replicas exactly as the local reader
does; ``DistributedDataset`` supplies the adapters, ``tf.distribute`` and Keras.
Iterators resume with ``get_state``/``set_state``: the state names this
consumer and how many rows of each split (or worker stream) it delivered, and
the dispatcher re-leases a restored consumer's assignments by index.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import grpc
import pyarrow.flight as flight

from reader.blocks import Columns
from reader.dataset import DistributedDataset
from reader.options import ReaderOptions
from reader.plan import InputContext, replica_ranges
from reader.service import splits, transport
from reader.service.auth import bearer
from reader.service.delivery import Delivered, DeliveryBatcher
from reader.service.dispatch_state import PROCESSING_MODES
from reader.service.rpc import DispatcherStub
from reader.snapshot import Snapshot
from schemas import columns
from schemas.errors import SnapfeedError, UsageError
from schemas.service_pb2 import AckRequest, JobRequest, LeaseRequest

log = logging.getLogger(__name__)

RPC_TIMEOUT_SECONDS = 30.0
POLL_SECONDS = 0.05
NO_WORKER_WAIT_SECONDS = 30.0
#: How long a consumer keeps retrying an unreachable dispatcher (a restart with --work_dir resumes the job).
DISPATCHER_RETRY_SECONDS = 60.0
STATE_VERSION = 1
#: Leased splits fetched concurrently ahead of the batcher (each about one 1 MiB block).
READ_AHEAD_SPLITS = 4
PARALLEL, DISTRIBUTED = "parallel_epochs", "distributed_epoch"


class ServiceUnavailableError(SnapfeedError, ConnectionError):
    """The dispatcher or every worker cannot be reached."""


class ServiceConnection:
    """Where the service is and how to talk to it: the dispatcher channel, worker clients, credentials."""

    def __init__(
        self,
        service: str,
        processing_mode: str,
        job_name: str | None,
        *,
        auth_token: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        if processing_mode not in PROCESSING_MODES:
            raise UsageError(f"processing_mode={processing_mode!r}; choose one of {', '.join(PROCESSING_MODES)}")
        if not service.startswith("grpc://"):
            raise UsageError(f"service={service!r}; give the dispatcher as grpc://host:port")
        self.address = service.removeprefix("grpc://")
        self.mode = processing_mode
        self.job_name = job_name
        self.metadata = bearer(auth_token)
        self.tls_ca = transport.read_ca(tls_ca, "service_tls_ca")
        headers = [(k.encode(), v.encode()) for k, v in self.metadata]
        #: A split fetch is short: a deadline on the whole call.
        self.flight_options = flight.FlightCallOptions(headers=headers, timeout=RPC_TIMEOUT_SECONDS)
        #: A parallel_epochs stream lasts the epoch at the consumer's pace: Flight's timeout would be a
        #: deadline on the whole stream, so none.
        self.stream_options = flight.FlightCallOptions(headers=headers)

    def channel(self) -> grpc.Channel:
        return transport.dispatcher_channel(self.address, self.tls_ca)

    def flight_client(self, worker: str) -> flight.FlightClient:
        return transport.flight_client(worker, self.tls_ca)

    def call(self, method, request):
        """A dispatcher call with a deadline, retried while the dispatcher is unreachable (restarting)."""
        deadline = time.monotonic() + DISPATCHER_RETRY_SECONDS
        while True:
            try:
                return method(request, timeout=RPC_TIMEOUT_SECONDS, metadata=self.metadata)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise _rpc_error(exc, self.address) from exc
                time.sleep(0.2)


class ServiceDataset(DistributedDataset):
    """Iterating yields steps like ``DistributedDataset``: a batch per local replica."""

    def __init__(
        self,
        snapshot: Snapshot,
        options: ReaderOptions,
        connection: ServiceConnection,
        *,
        strategy=None,
        map_fn: Callable | None = None,
    ) -> None:
        self._connection = connection
        # One job name for every iterator and restore of this dataset (and its tf.distribute pipelines).
        self._job_name = connection.job_name or f"anonymous-{uuid.uuid4().hex}"
        self._seed = options.seed if options.seed is not None else int(uuid.uuid4().int % (2**62))
        super().__init__(snapshot, options, strategy, map_fn)

    def _local_pipeline(self) -> None:
        names = [c.name for c in self.snapshot.metadata.columns]
        if unknown := [c for c in self.options.columns or () if c not in names]:
            raise UsageError(f"unknown columns {unknown}; {self.snapshot.path} has {names}")
        return None

    @property
    def columns(self) -> list[str]:
        return list(self.options.columns) if self.options.columns else [c.name for c in self.snapshot.metadata.columns]

    @property
    def steps_per_epoch(self) -> None:
        """Unknown: it depends on which splits this consumer wins."""
        return None

    def _iterator(self, first_epoch: int, adapt: Callable[[list], object]) -> ServiceIterator:
        return ServiceIterator(self, first_epoch, adapt)

    def _for_context(self, context: InputContext) -> ServiceDataset:
        per_pipeline = ServiceDataset(
            self.snapshot,
            dataclasses.replace(self.options, context=context, seed=self._seed),
            self._connection,
            map_fn=self._map_fn,
        )
        per_pipeline._job_name = self._job_name
        return per_pipeline

    def to_torch(self):
        raise UsageError("to_torch() reads locally; with service= iterate the dataset (output='torch') instead")


@dataclasses.dataclass
class _Cursor:
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
    def fresh(cls, epoch: int, job_name: str) -> _Cursor:
        return cls(epoch, f"{job_name}/{uuid.uuid4().hex[:12]}")

    def deliver(self, delivered: Delivered) -> None:
        for source, rows in delivered:
            self.held[source] = self.held.get(source, 0) + rows


class ServiceIterator:
    """Steps of a service job; ``get_state()``/``set_state()`` resume exactly (JSON-serializable)."""

    def __init__(self, dataset: ServiceDataset, first_epoch: int, adapt: Callable[[list], object]) -> None:
        self._dataset = dataset
        self._connection = dataset._connection
        self._adapt = adapt
        epochs = dataset.options.num_epochs
        self._stop_epoch = None if epochs is None else first_epoch + epochs
        self._cursor = _Cursor.fresh(first_epoch, dataset._job_name)
        self._steps: Iterator[list[Columns]] | None = None
        self._finished = False
        self._clients: dict[str, flight.FlightClient] = {}
        self._clients_lock = threading.Lock()

    def __iter__(self) -> ServiceIterator:
        return self

    def __next__(self):
        while not self._finished:
            if self._steps is None:
                self._steps = self._epoch_steps(self._cursor)
            try:
                return self._adapt(next(self._steps))
            except StopIteration:
                self._steps = None
                self._cursor = _Cursor.fresh(self._cursor.epoch + 1, self._dataset._job_name)
                self._finished = self._stop_epoch is not None and self._cursor.epoch >= self._stop_epoch
        self.close()
        raise StopIteration

    # -- state ---------------------------------------------------------------------------------
    def _config(self) -> str:
        d = self._dataset
        o = d.options
        shape = {
            "snapshot": [d.snapshot.snapshot_id, d.snapshot.metadata.run_id],
            "batch": o.global_batch_size,
            "context": [o.context.num_input_pipelines, o.context.input_pipeline_id, o.context.num_replicas_in_sync],
            "drop_remainder": o.drop_remainder,
            "columns": d.columns,
            "mode": self._connection.mode,
        }
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]

    def get_state(self) -> dict:
        cursor = self._cursor
        return {
            "version": STATE_VERSION,
            "service": True,
            "config": self._config(),
            "job_name": self._dataset._job_name,
            "seed": self._dataset._seed,
            "epoch": cursor.epoch,
            "consumer": cursor.consumer,
            "next_index": cursor.next_index,
            "held": [[source, rows] for source, rows in cursor.held.items()],
            "stop_epoch": self._stop_epoch,
            "finished": self._finished,
        }

    def set_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION or not state.get("service"):
            raise UsageError(f"not a snapfeed reader-service state (version {STATE_VERSION}): {state!r:.200}")
        if state["config"] != self._config():
            raise UsageError(
                "this state was saved by a service reader over another snapshot or with other options "
                "(batch size, replicas, columns, processing_mode); build the dataset with the same arguments"
            )
        self.close()
        self._dataset._job_name = state["job_name"]
        self._dataset._seed = int(state["seed"])
        self._cursor = _Cursor(
            int(state["epoch"]), state["consumer"], int(state["next_index"]), {s: int(r) for s, r in state["held"]}
        )
        self._stop_epoch = state["stop_epoch"]
        self._finished = bool(state["finished"])

    def close(self) -> None:
        """Stops reading (idempotent). Leases are kept until they expire, so a restore can re-claim them."""
        if self._steps is not None:
            self._steps.close()
            self._steps = None
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def __del__(self) -> None:
        self.close()

    # -- one epoch -------------------------------------------------------------------------------
    def _epoch_steps(self, cursor: _Cursor) -> Iterator[list[Columns]]:
        d = self._dataset
        context = d.options.context
        batcher = DeliveryBatcher(
            d.options.global_batch_size // context.num_input_pipelines, drop_remainder=d.options.drop_remainder
        )

        def step(batch: Columns) -> list[Columns]:
            rows = len(next(iter(batch.values())))
            return [
                {n: v[lo:hi] for n, v in batch.items()}
                for lo, hi in replica_ranges(rows, context.replicas_per_pipeline)
            ]

        with self._connection.channel() as channel:
            stub = DispatcherStub(channel)
            request = JobRequest(
                job_name=d._job_name,
                iteration=cursor.epoch,
                snapshot=d.snapshot.path,
                processing_mode=self._connection.mode,
                consumer=cursor.consumer,
                seed=d._seed,
            )
            job = self._connection.call(stub.GetJob, request)
            if self._connection.mode == PARALLEL:
                for batch in self._parallel(job, cursor, batcher):
                    yield step(batch)
                return
            renewer = _Renewer(self._connection, stub, job.job_id, cursor.consumer, job.lease_seconds)
            try:
                for batch in _Distributed(self, stub, request, job, cursor, batcher).batches():
                    yield step(batch)
            finally:
                renewer.stop()

    def _ticket(self, **fields) -> flight.Ticket:
        payload = {"snapshot": self._dataset.snapshot.path, "columns": self._dataset.columns, **fields}
        return flight.Ticket(json.dumps(payload).encode())

    def _client(self, worker: str) -> flight.FlightClient:
        """One Flight connection per worker, reused across splits and fetch threads (connecting per split dominated)."""
        with self._clients_lock:
            if worker not in self._clients:
                self._clients[worker] = self._connection.flight_client(worker)
            return self._clients[worker]

    def _forget(self, worker: str) -> None:
        with self._clients_lock:
            client = self._clients.pop(worker, None)
        if client is not None:
            client.close()

    def fetch_split(
        self, workers: list[str], refresh: Callable[[], list[str]], seed: int, epoch: int, split: int, offset: int
    ) -> list[Columns]:
        """The split's rows from ``offset``, read whole (one block, about 1 MiB), so no stream stays open.

        Splits go round-robin over the workers. If a worker fails mid-split the
        rest comes from the next one, from the received offset; when none
        answers, the live workers are asked again from the dispatcher (a worker
        may be restarting, or the dispatcher just restarted).
        """
        failures: list[str] = []
        received: list[Columns] = []
        deadline = time.monotonic() + NO_WORKER_WAIT_SECONDS
        while True:
            first = split % max(1, len(workers))
            for worker in workers[first:] + workers[:first]:
                ticket = self._ticket(mode=DISTRIBUTED, seed=seed, iteration=epoch, split=split, offset=offset)
                try:
                    for chunk in self._client(worker).do_get(ticket, self._connection.flight_options):
                        offset += chunk.data.num_rows
                        received.append(columns.batch_to_numpy(chunk.data))
                    return received
                except (flight.FlightUnauthorizedError, flight.FlightUnauthenticatedError) as exc:
                    raise UsageError(f"worker {worker} refused {self._dataset.snapshot.path}: {exc}") from exc
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
                    f"no worker could serve split {split} of {self._dataset.snapshot.path} within "
                    f"{NO_WORKER_WAIT_SECONDS:.0f} s: {failures[-4:] or 'no live workers'}"
                )
            time.sleep(0.2)
            workers = refresh()

    def _parallel(self, job, cursor: _Cursor, batcher: DeliveryBatcher) -> Iterator[Columns]:
        """Every worker's whole-epoch stream, interleaved; each resumes at the rows it already delivered."""
        if not job.workers:
            raise ServiceUnavailableError(f"the dispatcher at {self._connection.address} has no live workers")
        streams = {}
        for worker in job.workers:
            ticket = self._ticket(
                mode=PARALLEL, seed=job.seed, iteration=cursor.epoch, offset=cursor.held.get(worker, 0)
            )
            streams[worker] = iter(self._client(worker).do_get(ticket, self._connection.stream_options))
        while streams:
            for worker, stream in list(streams.items()):
                chunk = next(stream, None)
                if chunk is None:
                    del streams[worker]
                    continue
                batcher.add(worker, columns.batch_to_numpy(chunk.data))
                for batch, delivered in batcher.full_batches():
                    cursor.deliver(delivered)
                    yield batch
        batch, delivered = batcher.remainder()
        cursor.deliver(delivered)
        if batch is not None:
            yield batch


class _Distributed:
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

    def __init__(self, iterator: ServiceIterator, stub, request: JobRequest, job, cursor: _Cursor, batcher) -> None:
        self._iterator = iterator
        self._call = iterator._connection.call
        self._stub = stub
        self._request = request
        self._job = job
        self._cursor = cursor
        self._batcher = batcher
        pieces = splits.job_splits(iterator._dataset.snapshot.block_rows, job.seed, request.iteration)
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
        return lease.index, pool.submit(self._iterator.fetch_split, *args)

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


class _Renewer:
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
