"""The dispatcher: ``DispatchState`` behind gRPC, with a ``--work_dir`` journal and health checking.

The servicer only maps requests to the state machine and its errors to status
codes (bad requests -> INVALID_ARGUMENT, snapshots outside the allowed roots
-> PERMISSION_DENIED, a snapshot run that was replaced -> NOT_FOUND); the
server keeps serving after any of them. Split counts are per (directory, run
id): a rewritten snapshot is a new run (``reader.service.runs``). Snapshots
are local paths or URIs (``gs://``, ``s3://``), and so are ``--allowed_roots``
(``reader.service.roots``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from reader.core.plan import all_blocks
from reader.service import metrics, rpc, runs, splits, transport
from reader.service.auth import TokenInterceptor
from reader.service.config import DispatcherConfig, expect
from reader.service.dispatch_state import DispatchState, Event, Job, journal_line, read_journal
from reader.service.mixture_jobs import MixtureJob
from reader.service.protocol import DISTRIBUTED, ReplacedRunError
from reader.service.rollback import Restore, RollbackWait
from reader.service.roots import AllowedRoots, OutsideRootsError
from schemas import service_pb2 as pb
from schemas.errors import SnapfeedError, UsageError

JOURNAL = "dispatcher.journal.jsonl"
#: Snapshot runs whose split counts the dispatcher remembers.
RUNS_KEPT = 256


class _Journal:
    """Append-only JSON lines (``journal_line``), fsynced, replayed on start; ``size`` is its bytes (a metric)."""

    def __init__(self, work_dir: str | None) -> None:
        self._path = os.path.join(work_dir, JOURNAL) if work_dir else None
        if work_dir:
            os.makedirs(work_dir, exist_ok=True)
        self.size = os.path.getsize(self._path) if self._path and os.path.exists(self._path) else 0

    def read(self) -> list[Event]:
        """The journaled events; one error naming the line when one is not an event (``read_journal``)."""
        if not self._path or not os.path.exists(self._path):
            return []
        with open(self._path) as handle:
            return read_journal(handle, self._path)

    def append(self, events: list[Event]) -> None:
        if not self._path or not events:
            return
        with open(self._path, "a") as handle:
            for event in events:
                handle.write(journal_line(event) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            self.size = handle.tell()


def _mixture_split_rows(opened, mixture: str):
    """Rows of each split (window) of the mixture job ``mixture`` defines over ``opened``, its sources' runs."""
    job = MixtureJob.from_json(mixture)
    return job.split_rows(job.mixture(opened))


def _split_count(opened, mixture: str) -> int:
    """How many splits a job over ``opened`` (a run, or a union's runs) has: a mixture's windows when
    ``mixture`` defines one, else the snapshot's splits of blocks."""
    if mixture:
        return len(_mixture_split_rows(opened, mixture))
    return splits.split_count(all_blocks(opened.block_rows))


class DispatchServicer:
    def __init__(self, state: DispatchState, journal: _Journal, allowed_roots: AllowedRoots) -> None:
        self._state = state
        self._journal = journal
        self._allowed = allowed_roots
        self.lock = threading.Lock()  # the state's: every call, and a metrics scrape
        self._num_splits = runs.BoundedCache(RUNS_KEPT)

    def _resolve(self, snapshot: str, context) -> str:
        """The canonical snapshot path (local or URI) when it is within the allowed roots; else the call aborts."""
        try:
            return self._allowed.resolve(snapshot)
        except OutsideRootsError as exc:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def _splits_of(self, resolved: str, run_id: str, mixture: str, context) -> int:
        """How many splits run ``run_id`` of the snapshot has (a mixture's: its windows); NOT_FOUND when that run
        was replaced."""
        try:
            return self._num_splits.get(
                (resolved, run_id, mixture), lambda: _split_count(runs.open_run(resolved, run_id), mixture)
            )
        except ReplacedRunError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except UsageError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except SnapfeedError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def Heartbeat(self, request: pb.WorkerHeartbeat, context) -> pb.Empty:  # noqa: N802 - gRPC method names
        if not request.address.startswith("grpc://"):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"worker address {request.address!r} is not grpc://host:port"
            )
        with self.lock:
            if request.leaving:
                self._state.worker_left(request.address)
            else:
                self._state.worker_heartbeat(request.address, now=time.time())
        return pb.Empty()

    def GetJob(self, request: pb.JobRequest, context) -> pb.JobReply:  # noqa: N802
        snapshot = self._resolve(request.snapshot, context)
        num_splits = self._splits_of(snapshot, request.run_id, request.mixture, context)
        with self.lock:
            now = time.time()
            self._state.touch(request.consumer, now=now)
            try:
                job, events = self._state.get_or_create_job(
                    job_name=request.job_name,
                    iteration=request.iteration,
                    snapshot=snapshot,
                    run_id=request.run_id,
                    mode=request.processing_mode,
                    num_splits=num_splits,
                    consumer=request.consumer,
                    seed=request.seed,
                    start_step=request.start_step,
                    batch_rows=request.batch_rows,
                    mixture=request.mixture,
                )
            except UsageError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            self._journal.append(events)
            if request.HasField("rollback") and job.mode == DISTRIBUTED:
                self._roll_back(job, request, now, context)
            leases, end_of_epoch = [], False
            if request.lease_count and job.mode == DISTRIBUTED:  # the epoch's first leases, in the same round trip
                leases, end_of_epoch = self._lease_splits(
                    job.job_id, request.consumer, request.lease_index, request.lease_count, context
                )
            workers = self._state.live_workers(now=time.time())
        return pb.JobReply(
            job_id=job.job_id,
            num_splits=job.num_splits,
            workers=workers,
            seed=job.seed,
            lease_seconds=self._state.lease_seconds,
            splits=_leased(leases),
            end_of_epoch=end_of_epoch,
        )

    def _roll_back(self, job: Job, request: pb.JobRequest, now: float, context) -> None:
        """Takes the job back to the state a restored consumer restores, journaled (caller holds the lock)."""
        sent = request.rollback
        restore = Restore(sent.consumer, sent.next_index, dict(sent.held), sent.step if sent.HasField("step") else None)
        try:
            self._journal.append(
                self._state.roll_back(job.job_id, request.consumer, restore, now=now, rows_of=self._rows_of)
            )
        except RollbackWait as exc:
            context.abort(grpc.StatusCode.ABORTED, str(exc))  # the consumer asks again (``connection.RETRIED``)
        except UsageError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    def _rows_of(self, job: Job):
        """``split -> rows`` of ``job`` (its run, seed and epoch order the blocks; a mixture's plan sizes its windows)."""
        try:
            opened = runs.open_run(job.snapshot, job.run_id)
        except SnapfeedError as exc:
            raise UsageError(f"job {job.key.job_name!r} cannot be taken back: {exc}") from exc
        if job.mixture:
            counts = _mixture_split_rows(opened, job.mixture)
        else:
            counts = splits.all_split_rows(opened.block_rows, job.seed, job.key.iteration)
        return lambda split: int(counts[split])

    def LeaseSplit(self, request: pb.LeaseRequest, context) -> pb.LeaseReply:  # noqa: N802
        with self.lock:
            self._state.touch(request.consumer, now=time.time())
            refused = [split for split in request.acked if not self._ack(request.job_id, split, request.consumer)]
            if request.HasField("index"):
                leases, end_of_epoch = self._lease_splits(
                    request.job_id, request.consumer, request.index, request.count, context
                )
            else:
                try:
                    lease, events = self._state.lease_split(request.job_id, request.consumer, now=time.time())
                except UsageError as exc:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                self._journal.append(events)
                leases, end_of_epoch = ([lease] if lease.split is not None else []), lease.end_of_epoch
            workers = self._state.live_workers(now=time.time())
        return pb.LeaseReply(splits=_leased(leases), end_of_epoch=end_of_epoch, workers=workers, ack_refused=refused)

    def _lease_splits(self, job_id: int, consumer: str, index: int, count: int, context) -> tuple[list, bool]:
        """Assignments ``index`` .. ``index + count - 1`` of ``consumer``, journaled (caller holds the lock).

        LeaseSplit and a GetJob that leases both come here, so a journal
        replays the same state whichever of the two leased.
        """
        try:
            leases, end_of_epoch, events = self._state.lease_splits(
                job_id, consumer, now=time.time(), index=index, count=count
            )
        except UsageError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._journal.append(events)
        return leases, end_of_epoch

    def Renew(self, request: pb.LeaseRequest, context) -> pb.Empty:  # noqa: N802
        with self.lock:
            self._state.touch(request.consumer, now=time.time())
            try:
                self._journal.append(self._state.renew(request.job_id, request.consumer, now=time.time()))
            except UsageError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.Empty()

    def AckSplit(self, request: pb.AckRequest, context) -> pb.Empty:  # noqa: N802
        with self.lock:
            self._state.touch(request.consumer, now=time.time())
            try:
                event = self._state.ack_split(request.job_id, request.split, request.consumer)
            except UsageError as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            self._journal.append([event] if event else [])
        return pb.Empty()

    def _ack(self, job_id: int, split: int, consumer: str) -> bool:
        """An ack carried by a lease request, journaled (caller holds the lock); False: refused.

        Refused when another consumer holds the split now: the lease request
        still leases, and the reply names the refused split (the consumer logs it).
        """
        try:
            event = self._state.ack_split(job_id, split, consumer)
        except UsageError:
            return False
        self._journal.append([event] if event else [])
        return True

    def StreamsRead(self, request: pb.LeaseRequest, context) -> pb.Empty:  # noqa: N802
        with self.lock:
            try:
                event = self._state.streams_read(request.job_id, request.consumer)
            except UsageError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            self._journal.append([event] if event else [])
        return pb.Empty()

    def Status(self, request: pb.Empty, context) -> pb.StatusReply:  # noqa: N802
        with self.lock:
            return pb.StatusReply(json=json.dumps(self._state.status(now=time.time()), sort_keys=True))


def _leased(leases: list) -> list[pb.LeasedSplit]:
    return [pb.LeasedSplit(split=x.split, index=x.index, taken_over=x.taken_over, offset=x.offset) for x in leases]


class DispatchServer:
    """In-process dispatcher: ``.target`` ("grpc://host:port"), ``.start()``, idempotent ``.stop()``, ``.join()``.

    With ``config.work_dir`` every change is journaled and a restarted
    dispatcher resumes the jobs, acks and leases it had. With TLS files in
    ``config.security`` it serves TLS only; ``.target`` stays grpc:// (see
    ``transport``). The standard gRPC health service answers on the same port
    (``.health_target``). With ``config.metrics_port`` Prometheus metrics are
    served over HTTP on its host at ``.metrics_target`` (``reader.service.metrics``).

    Args:
        config: what it serves with (``reader.service.DispatcherConfig``); None: the defaults (any free port).
    """

    def __init__(self, config: DispatcherConfig | None = None) -> None:
        self.config = config = expect(
            DispatcherConfig() if config is None else config, DispatcherConfig, "DispatchServer"
        )
        host, security = config.host, config.security
        roots = AllowedRoots(list(config.allowed_roots), server="dispatcher")
        tls = security.tls()
        started = time.monotonic()
        journal = _Journal(config.work_dir)
        state = DispatchState.replay(journal.read(), now=time.time(), lease_seconds=config.lease_seconds)
        recovery_seconds = time.monotonic() - started
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=config.max_workers),
            interceptors=[TokenInterceptor(security.auth_token)] if security.auth_token else [],
            options=[
                ("grpc.max_receive_message_length", config.max_message_bytes),
                ("grpc.max_send_message_length", config.max_message_bytes),
            ],
        )
        servicer = DispatchServicer(state, journal, roots)
        self._server.add_generic_rpc_handlers([rpc.handlers(servicer)])
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        self.target = f"grpc://{host}:{transport.add_port(self._server, host, config.port, tls)}"
        self.health_target = self.target
        registry = CollectorRegistry()
        registry.register(metrics.DispatcherCollector(state, servicer.lock, lambda: journal.size, recovery_seconds))
        self._metrics = metrics.endpoint(registry, host, config.metrics_port)
        self.metrics_target = self._metrics.target if self._metrics else None
        self._stopped = False

    def start(self) -> DispatchServer:
        self._server.start()
        self._health.set("", health_pb2.HealthCheckResponse.SERVING)
        self._health.set(rpc.SERVICE, health_pb2.HealthCheckResponse.SERVING)
        return self

    def stop(self, grace: float = 5.0) -> None:
        """Drains: health goes NOT_SERVING and calls in flight finish; idempotent.

        Args:
            grace: seconds calls in flight get to finish before they are cancelled.
        """
        if not self._stopped:
            self._stopped = True
            self._health.enter_graceful_shutdown()
            self._server.stop(grace).wait()
            if self._metrics:
                self._metrics.close()

    def join(self) -> None:
        self._server.wait_for_termination()
