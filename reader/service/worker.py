"""A reader-service worker: an Arrow Flight server streaming a job's splits as record batches.

Tickets are JSON naming a snapshot (a local path or a ``gs://``/``s3://``
URI), the run the consumer planned from, and what to stream from it; nothing
executable travels (no pickles, no graphs). Runs are held open by (directory,
run id), a bounded number of them (``reader.service.runs``): a rewritten
snapshot is a new run, and a run the worker no longer has is refused, never
served from another run. Snapshots outside ``allowed_roots`` (local folders or URI prefixes,
compared after resolving ``..`` and symlinks: ``reader.service.roots``) are
refused with PERMISSION_DENIED. The worker announces itself to the dispatcher
with a heartbeat thread, and serves the standard gRPC health service on a
second port (``health_target``): Flight servers cannot host other gRPC services.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent import futures

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as flight
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from reader.core import allocator
from reader.core.blocks import BlockReader
from reader.core.cache import ShardCache
from reader.core.mixture import MixtureOrder, MixtureWindow
from reader.core.options import VERIFY_CHECKSUMS
from reader.core.plan import all_blocks
from reader.core.union import Readable
from reader.service import metrics, mixture_jobs, runs, splits, transport, worker_streams
from reader.service.auth import FlightTokenMiddlewareFactory, bearer
from reader.service.config import WorkerConfig, expect
from reader.service.failure_log import FailureLog
from reader.service.metrics import WorkerMetrics
from reader.service.mixture_jobs import MixtureJob
from reader.service.protocol import (
    DISPATCHER_ACTION,
    DISTRIBUTED,
    PARALLEL,
    REPLACED_RUN,
    STREAM_FORMAT,
    ReplacedRunError,
)
from reader.service.roots import AllowedRoots, OutsideRootsError
from reader.service.rpc import DispatcherStub, described
from schemas.errors import SnapfeedError, UsageError
from schemas.service_pb2 import WorkerHeartbeat

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0
#: Snapshot runs a worker keeps open (a rewritten snapshot is a new run; the oldest let go closes its files).
RUNS_KEPT = 8
#: Column projections of one run a worker keeps open (with and without CRC32C checks: sources of their own).
PROJECTIONS_KEPT = 4
#: Jobs of one run whose split order a worker keeps (a few epochs of a few jobs).
JOBS_REMEMBERED = 16
#: What a dispatcher answers a worker it will never register (waiting does not change it).
REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)


class _Ticket:
    """A parsed, validated ticket: {snapshot, run_id, mode, seed, iteration, batch_rows, head?, split?, offset?,
    columns?, verify_checksums?, mixture?}: rows are sent in record batches of ``batch_rows``, the first of ``head``
    rows when given; ``verify_checksums`` (True, "blocks" or absent) is checked as the local reader checks it;
    ``mixture``: a mixture job's definition (``mixture_jobs.MixtureJob``), whose splits are windows."""

    def __init__(self, raw: bytes) -> None:
        try:
            fields = json.loads(raw)
            self.snapshot = str(fields["snapshot"])
            self.run_id = str(fields["run_id"])
            self.mode = fields["mode"]
            self.seed = int(fields["seed"])
            self.iteration = int(fields["iteration"])
            self.split = int(fields.get("split", -1))
            self.offset = int(fields.get("offset", 0))
            self.batch_rows = int(fields["batch_rows"])
            self.head = int(fields.get("head", 0))
            self.columns = fields.get("columns")
            self.mixture = str(fields.get("mixture") or "")
            verify = fields.get("verify_checksums", False)
            self.verify_checksums = verify if verify in VERIFY_CHECKSUMS and isinstance(verify, bool | str) else False
        except (ValueError, KeyError, TypeError) as exc:
            raise flight.FlightServerError(f"malformed ticket ({exc}): {raw[:200]!r}") from exc
        if self.mode not in (PARALLEL, DISTRIBUTED) or (self.mode == DISTRIBUTED and self.split < 0):
            raise flight.FlightServerError(f"malformed ticket: mode={self.mode!r} split={self.split}")
        if self.batch_rows < 1 or not 0 <= self.head < self.batch_rows:
            raise flight.FlightServerError(f"malformed ticket: batch_rows={self.batch_rows} head={self.head}")


class _ServedRun:
    """One run of a snapshot as this worker serves it: block readers per projection and the jobs' block orders."""

    def __init__(self, snapshot: Readable, cache: ShardCache | None = None) -> None:
        self.snapshot = snapshot
        self._cache = cache  # bucket shards read from the host's cache (reader.core.cache.shard_cache)
        self._blocks = all_blocks(snapshot.block_rows)
        self._projections = runs.BoundedCache(PROJECTIONS_KEPT)
        self._job_blocks = runs.BoundedCache(JOBS_REMEMBERED)
        self._mixture_orders = runs.BoundedCache(JOBS_REMEMBERED)
        self._windows_lock = threading.Lock()  # a MixtureOrder computes and keeps epochs' windows: one caller at a time

    def projection(self, names: list[str], verify_checksums: bool | str) -> tuple[BlockReader, pa.Schema]:
        """The block reader of the columns ``names`` and the schema their streams have.

        ``verify_checksums`` (True or "blocks"): a reader of its own, which checks what that option says.
        """
        key = (tuple(names), verify_checksums)
        return self._projections.get(key, lambda: self._project(names, verify_checksums))

    def _project(self, names: list[str], verify_checksums: bool | str) -> tuple[BlockReader, pa.Schema]:
        schema = self.snapshot.schema
        stream_schema = pa.schema([schema.field(n) for n in names], metadata=STREAM_FORMAT)
        source = BlockReader(self.snapshot, names, verify_checksums=verify_checksums, cache=self._cache)
        return source, stream_schema

    def job_blocks(self, seed: int, iteration: int) -> splits.JobOrder:
        """A job's blocks in order, computed once per job, not per request (a permutation of every block)."""
        return self._job_blocks.get((seed, iteration), lambda: splits.job_blocks(self._blocks, seed, iteration))

    def mixture_windows(self, definition: str, seed: int, iteration: int) -> list[MixtureWindow]:
        """The windows of epoch ``iteration`` of the mixture job ``definition`` defines over this run, by ``seed``:
        one order per job, which keeps a few epochs' windows (each epoch continues where the last one stopped)."""

        def build() -> MixtureOrder:
            job = MixtureJob.from_json(definition)
            return job.order(job.mixture(self.snapshot), seed)

        order = self._mixture_orders.get((definition, seed), build)
        with self._windows_lock:
            return order.windows(iteration)


class _FlightWorker(flight.FlightServerBase):
    def __init__(
        self,
        location: str,
        allowed_roots: AllowedRoots,
        dispatcher: str,
        cache: ShardCache | None,
        **kwargs,
    ) -> None:
        super().__init__(location, **kwargs)
        self._cache = cache
        self.location_uri = location  # the port is known after binding; WorkerServer sets the final one
        self.metrics: WorkerMetrics | None = None  # labelled with the final location: WorkerServer sets it
        self._allowed = allowed_roots
        self._dispatcher = dispatcher
        self._runs = runs.BoundedCache(RUNS_KEPT)
        #: Set when the worker starts draining: new streams are refused from then on, not only once
        #: Flight's shutdown begins (that waits for the last heartbeat, which says the worker leaves).
        self.draining = threading.Event()
        # pa.array on NumPy (numpy_to_record_batch) imports pandas at its first call, about 0.3 s holding the
        # GIL: done here, not in the first stream, where every stream of the worker would wait on it.
        pa.array(np.zeros(1))
        allocator.keep_freed_batches()  # each record batch sent is a fresh gather (see reader.core.allocator)

    def _run(self, request: _Ticket) -> _ServedRun:
        try:
            resolved = self._allowed.resolve(request.snapshot)
        except OutsideRootsError as exc:
            raise flight.FlightUnauthorizedError(f"PERMISSION_DENIED: {exc}") from exc
        except ValueError as exc:
            raise flight.FlightServerError(str(exc)) from exc
        try:
            return self._runs.get(
                (resolved, request.run_id), lambda: _ServedRun(runs.open_run(resolved, request.run_id), self._cache)
            )
        except ReplacedRunError as exc:
            raise flight.FlightServerError(str(exc), extra_info=REPLACED_RUN) from exc
        except SnapfeedError as exc:
            raise flight.FlightServerError(str(exc)) from exc

    def list_actions(self, context):
        return [(DISPATCHER_ACTION, "the dispatcher address this worker registers with")]

    def do_action(self, context, action):
        """Names this worker's dispatcher, for a consumer given this port as ``service=`` by mistake."""
        if action.type != DISPATCHER_ACTION:
            raise flight.FlightServerError(f"unknown action {action.type!r}; this worker answers {DISPATCHER_ACTION!r}")
        yield flight.Result(self._dispatcher.encode())

    def do_get(self, context, ticket):
        try:
            return self._stream(ticket)
        except Exception:
            self.metrics.failed()
            raise

    def _stream(self, ticket) -> flight.GeneratorStream:
        if self.draining.is_set():
            raise flight.FlightUnavailableError(f"worker {self.location_uri} is draining; ask the dispatcher again")
        request = _Ticket(ticket.ticket)
        run = self._run(request)
        snapshot = run.snapshot
        try:
            names = snapshot.readable_columns(request.columns or None)
        except UsageError as exc:
            raise flight.FlightServerError(str(exc)) from exc
        source, schema = run.projection(names, request.verify_checksums)
        read_bytes = self.metrics.storage_read.inc
        if request.mixture:
            windows = self._mixture_windows(run, request)
            stream = worker_streams.windows_in_delivery_order(
                source, windows, schema, request.batch_rows, request.head, read_bytes
            )
        else:
            parts = self._split_parts(run, request) if request.mode == DISTRIBUTED else self._whole_epoch(run, request)
            stream = worker_streams.in_delivery_order(
                source, snapshot.element_spec, parts, schema, request.batch_rows, request.head, read_bytes
            )
        resumed = request.mode == DISTRIBUTED and request.offset > 0
        return flight.GeneratorStream(schema, self.metrics.served(request.mode, resumed, stream))

    def _split_parts(self, run: _ServedRun, request: _Ticket):
        """The parts of the split's blocks the consumer still needs."""
        blocks = run.job_blocks(request.seed, request.iteration)
        if not 0 <= request.split < (count := splits.split_count(blocks)):
            raise flight.FlightServerError(f"split {request.split} out of range ({count} splits)")
        return splits.remaining_parts(blocks, request.seed, request.iteration, request.split, request.offset)

    def _mixture_windows(self, run: _ServedRun, request: _Ticket) -> list[tuple[MixtureWindow, int]]:
        """A mixture job's split (one window), or a parallel_epochs worker's whole epoch of windows, each with the
        rows of it the consumer already has."""
        try:
            windows = run.mixture_windows(request.mixture, request.seed, request.iteration)
        except UsageError as exc:
            raise flight.FlightServerError(str(exc)) from exc
        if request.mode == PARALLEL:
            return list(mixture_jobs.windows_from(windows, request.offset))
        if not 0 <= request.split < len(windows):
            raise flight.FlightServerError(f"split {request.split} out of range ({len(windows)} windows)")
        window = windows[request.split]
        if not 0 <= request.offset <= window.rows:
            raise flight.FlightServerError(f"offset {request.offset} out of split {request.split} ({window.rows} rows)")
        return [(window, request.offset)]

    def _whole_epoch(self, run: _ServedRun, request: _Ticket):
        """The whole snapshot in the block order of the ticket's seed, from row ``offset``.

        The seed is this worker's own (``splits.worker_seed``), derived by the
        consumer, which resumes the stream by it.
        """
        blocks = run.job_blocks(request.seed, request.iteration)
        return splits.stream_parts(blocks, 0, request.seed, request.iteration, request.offset)


class _HealthServer:
    """The standard gRPC health service (grpc.health.v1) alone on its own port."""

    def __init__(self, host: str, port: int, tls: transport.ServerTls | None) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self.target = f"grpc://{host}:{transport.add_port(self._server, host, port, tls)}"

    def start(self) -> None:
        self._server.start()
        self._health.set("", health_pb2.HealthCheckResponse.SERVING)

    def draining(self) -> None:
        self._health.enter_graceful_shutdown()  # NOT_SERVING for every service

    def stop(self) -> None:
        self._server.stop(grace=1.0).wait()

    def join(self) -> None:
        self._server.wait_for_termination()


class WorkerServer:
    """An in-process worker: ``.target`` ("grpc://host:port"), ``.start()``, idempotent ``.stop()``, ``.join()``.

    ``.health_target`` serves gRPC health checking (``config.health_port``).
    With TLS files in ``config.security`` both ports serve TLS only;
    ``config.dispatcher_tls_ca`` verifies a TLS dispatcher. ``.stop()`` drains:
    the worker leaves the dispatcher's live workers, health goes NOT_SERVING,
    no new streams are accepted, and it returns once the streams in flight have
    finished, or after ``config.drain_seconds`` (a consumer that stopped reading
    without closing its stream would hold it forever; what is still open then
    ends when the process exits).

    A dispatcher that refuses the worker (a wrong ``--auth_token_file``, a TLS
    mismatch) stops it: ``.failure`` says why, and the command exits with it. A
    worker never registered would be SERVING to nobody, and the refusal does
    not heal by waiting; an unreachable dispatcher (restarting) is only logged.

    With ``config.cache`` (a ``reader.CacheOptions`` with a ``dir``) shards of bucket snapshots are read from the
    host's cache, shared with the readers there (``reader.core.cache.shard_cache``). With ``config.metrics_port``
    Prometheus metrics are served over HTTP on its host at ``.metrics_target`` (``reader.service.metrics``).

    Args:
        config: what it serves with and where its dispatcher is (``reader.service.WorkerConfig``).
    """

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config = expect(config, WorkerConfig, "WorkerServer")
        host, security = config.host, config.security
        roots = AllowedRoots(list(config.allowed_roots), server="worker")
        tls = security.tls()
        self._drain_seconds = config.drain_seconds
        self._dispatcher = config.dispatcher_address.removeprefix("grpc://")
        self._dispatcher_tls_ca = transport.read_ca(config.dispatcher_tls_ca, "--dispatcher_tls_ca")
        self._token = security.auth_token
        registry = CollectorRegistry()  # served first: a port in use stops the worker before Flight serves
        self._metrics = metrics.endpoint(registry, host, config.metrics_port)
        self.metrics_target = self._metrics.target if self._metrics else None
        self._health = _HealthServer(host, config.health_port, tls)  # binds before Flight, which serves at once
        self.health_target = self._health.target
        middleware = {"auth": FlightTokenMiddlewareFactory(self._token)} if self._token else None
        cache = config.cache.open()
        self._server = _FlightWorker(
            allowed_roots=roots,
            dispatcher=self._dispatcher,
            cache=cache,
            middleware=middleware,
            **transport.flight_server_options(host, config.port, tls),
        )
        self.target = f"grpc://{host}:{self._server.port}"
        self._server.location_uri = self.target
        self._server.metrics = WorkerMetrics(registry, self.target, self._server.draining.is_set)
        if cache is not None:
            registry.register(metrics.CacheCollector(self.target, cache))
        #: Why the dispatcher refused this worker (None while it has not).
        self.failure: str | None = None
        #: Whether ``stop()`` gave up on streams still open after ``drain_seconds`` (they hold the process).
        self.abandoned_streams = False
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._done = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="snapfeed-worker-heartbeat", daemon=True)

    def _beat(self) -> None:
        """Heartbeats until stopped, then says it leaves; each new reason a heartbeat fails is logged once.

        An unreachable dispatcher may be restarting: logged, retried. A refusal stops the worker.
        """
        failures = FailureLog(
            log, f"worker {self.target} cannot register with the dispatcher at grpc://{self._dispatcher}"
        )
        with transport.dispatcher_channel(self._dispatcher, self._dispatcher_tls_ca, "--dispatcher_tls_ca") as channel:
            stub = DispatcherStub(channel)
            while not self._stopped.is_set():
                try:
                    self._send(stub, leaving=False, timeout=HEARTBEAT_SECONDS * 5)
                    failures.succeeded()
                except grpc.RpcError as exc:
                    problem = described(exc)
                    if exc.code() in REFUSALS:
                        return self._refused(problem)
                    failures.failed(problem)
                except UsageError as exc:  # the TLS settings of the two sides disagree
                    return self._refused(str(exc))
                self._stopped.wait(HEARTBEAT_SECONDS)
            try:
                self._send(stub, leaving=True, timeout=HEARTBEAT_SECONDS)
                return
            except grpc.RpcError as exc:
                problem = described(exc)
            except UsageError as exc:
                problem = str(exc)
            log.warning(
                "worker %s could not tell the dispatcher at grpc://%s it is draining (%s); it drops the worker when "
                "its heartbeats stop",
                self.target,
                self._dispatcher,
                problem,
            )

    def _send(self, stub, *, leaving: bool, timeout: float) -> None:
        heartbeat = WorkerHeartbeat(address=self.target, leaving=leaving)
        stub.Heartbeat(heartbeat, timeout=timeout, metadata=bearer(self._token))

    def _refused(self, problem: str) -> None:
        self.failure = (
            f"worker {self.target}: the dispatcher at grpc://{self._dispatcher} refused it ({problem}); give the "
            f"worker the dispatcher's --auth_token_file and TLS settings"
        )
        log.error("%s; stopping", self.failure)
        threading.Thread(target=self.stop, name="snapfeed-worker-stop", daemon=True).start()

    def start(self) -> WorkerServer:
        self._health.start()
        self._heartbeat.start()
        return self

    def stop(self) -> None:
        """Drains (see the class); idempotent, and concurrent calls return once it is done."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            self._server.draining.set()
            self._health.draining()
            if self._heartbeat.is_alive() and threading.current_thread() is not self._heartbeat:
                self._heartbeat.join(HEARTBEAT_SECONDS * 2)  # its last heartbeat says the worker leaves
            shutting_down = threading.Thread(target=self._server.shutdown, name="snapfeed-worker-drain", daemon=True)
            shutting_down.start()  # refuses new streams, returns when those in flight are done
            shutting_down.join(self._drain_seconds)
            self.abandoned_streams = shutting_down.is_alive()
            if self.abandoned_streams:
                log.warning(
                    "worker %s: streams still open after draining %.0f s (a consumer stopped reading without "
                    "closing its stream); stopping without waiting for them",
                    self.target,
                    self._drain_seconds,
                )
            self._health.stop()
            if self._metrics:
                self._metrics.close()
            self._done.set()

    def join(self) -> None:
        # Polls instead of blocking in Flight's C++ wait, so signal handlers (SIGTERM drain) can run.
        while not self._done.wait(0.5):
            pass
