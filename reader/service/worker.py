"""A reader-service worker: an Arrow Flight server streaming a job's splits as record batches.

Tickets are JSON naming a snapshot and what to stream from it; nothing
executable travels (no pickles, no graphs). Snapshots outside
``allowed_roots`` (after resolving ``..`` and symlinks) are refused. The
worker announces itself to the dispatcher with a heartbeat thread.
"""

from __future__ import annotations

import json
import os
import threading

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from reader.blocks import BlockSource
from reader.service import splits
from reader.service.auth import FlightTokenMiddlewareFactory, bearer
from reader.service.rpc import DispatcherStub
from reader.snapshot import Snapshot, open_snapshot
from schemas.errors import SnapfeedError
from schemas.service_pb2 import WorkerHeartbeat

HEARTBEAT_SECONDS = 1.0
PARALLEL, DISTRIBUTED = "parallel_epochs", "distributed_epoch"


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


class _Ticket:
    """A parsed, validated ticket: {snapshot, mode, seed, iteration, split?, offset?, columns?}."""

    def __init__(self, raw: bytes) -> None:
        try:
            fields = json.loads(raw)
            self.snapshot = str(fields["snapshot"])
            self.mode = fields["mode"]
            self.seed = int(fields["seed"])
            self.iteration = int(fields["iteration"])
            self.split = int(fields.get("split", -1))
            self.offset = int(fields.get("offset", 0))
            self.columns = fields.get("columns")
        except (ValueError, KeyError, TypeError) as exc:
            raise flight.FlightServerError(f"malformed ticket ({exc}): {raw[:200]!r}") from exc
        if self.mode not in (PARALLEL, DISTRIBUTED) or (self.mode == DISTRIBUTED and self.split < 0):
            raise flight.FlightServerError(f"malformed ticket: mode={self.mode!r} split={self.split}")


class _FlightWorker(flight.FlightServerBase):
    def __init__(self, location: str, allowed_roots: list[str], **kwargs) -> None:
        super().__init__(location, **kwargs)
        self.location_uri = location  # the port is known after binding; WorkerServer sets the final one
        self._allowed = [_real(root) for root in allowed_roots]
        self._snapshots: dict[str, Snapshot] = {}
        self._sources: dict[tuple[str, tuple[str, ...]], BlockSource] = {}
        self._lock = threading.Lock()

    def _snapshot(self, path: str) -> Snapshot:
        resolved = _real(path)
        if self._allowed and not any(resolved == root or resolved.startswith(root + os.sep) for root in self._allowed):
            raise flight.FlightUnauthorizedError(
                f"PERMISSION_DENIED: {path} is outside this worker's --allowed_roots {self._allowed}"
            )
        with self._lock:
            if resolved not in self._snapshots:
                try:
                    self._snapshots[resolved] = open_snapshot(resolved)
                except SnapfeedError as exc:
                    raise flight.FlightServerError(str(exc)) from exc
            return self._snapshots[resolved]

    def _source(self, snapshot: Snapshot, names: list[str]) -> BlockSource:
        key = (snapshot.path, tuple(names))
        with self._lock:
            if key not in self._sources:
                self._sources[key] = BlockSource(snapshot, names, verify_checksums=False)
            return self._sources[key]

    def do_get(self, context, ticket):
        request = _Ticket(ticket.ticket)
        snapshot = self._snapshot(request.snapshot)
        names = [c.name for c in snapshot.metadata.columns]
        if request.columns:
            if unknown := [c for c in request.columns if c not in names]:
                raise flight.FlightServerError(f"unknown columns {unknown}; {snapshot.path} has {names}")
            names = list(request.columns)
        source = self._source(snapshot, names)
        schema = snapshot.schema
        schema = pa.schema([schema.field(n) for n in names])
        if request.mode == DISTRIBUTED:
            return flight.GeneratorStream(schema, self._split_rows(snapshot, source, request))
        return flight.GeneratorStream(schema, self._whole_epoch(snapshot, source, request))

    def _split_rows(self, snapshot: Snapshot, source: BlockSource, request: _Ticket):
        pieces = splits.job_splits(snapshot.block_rows, request.seed, request.iteration)
        if request.split >= len(pieces):
            raise flight.FlightServerError(f"split {request.split} out of range ({len(pieces)} splits)")
        piece = pieces[request.split]
        order = splits.rows_in_split(piece.rows, request.seed, request.iteration, request.split)
        block = source.read_arrow(piece)
        yield block.take(pa.array(order[request.offset :]))

    def _whole_epoch(self, snapshot: Snapshot, source: BlockSource, request: _Ticket):
        seed = splits.worker_seed(request.seed, self.location_uri)
        for index, piece in enumerate(splits.job_splits(snapshot.block_rows, seed, request.iteration)):
            block = source.read_arrow(piece)
            yield block.take(pa.array(splits.rows_in_split(piece.rows, seed, request.iteration, index)))


class WorkerServer:
    """An in-process worker: ``.target`` ("grpc://host:port"), ``.start()``, idempotent ``.stop()``, ``.join()``."""

    def __init__(
        self,
        dispatcher_address: str,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        allowed_roots: list[str] | None = None,
        auth_token: str | None = None,
    ) -> None:
        self._dispatcher = dispatcher_address.removeprefix("grpc://")
        self._token = auth_token
        middleware = {"auth": FlightTokenMiddlewareFactory(auth_token)} if auth_token else None
        self._server = _FlightWorker(f"grpc://{host}:{port}", list(allowed_roots or []), middleware=middleware)
        self.target = f"grpc://{host}:{self._server.port}"
        self._server.location_uri = self.target
        self._stopped = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, name="snapfeed-worker-heartbeat", daemon=True)

    def _beat(self) -> None:
        with grpc.insecure_channel(self._dispatcher) as channel:
            stub = DispatcherStub(channel)
            while not self._stopped.is_set():
                try:
                    stub.Heartbeat(
                        WorkerHeartbeat(address=self.target),
                        timeout=HEARTBEAT_SECONDS * 5,
                        metadata=bearer(self._token),
                    )
                except grpc.RpcError:
                    pass  # the dispatcher may be restarting; keep trying
                self._stopped.wait(HEARTBEAT_SECONDS)

    def start(self) -> WorkerServer:
        self._heartbeat.start()
        return self

    def stop(self) -> None:
        if not self._stopped.is_set():
            self._stopped.set()
            self._server.shutdown()

    def join(self) -> None:
        # Poll instead of blocking in Flight's C++ wait, so signal handlers (SIGTERM drain) can run.
        while not self._stopped.wait(0.5):
            pass
        self._server.wait()
