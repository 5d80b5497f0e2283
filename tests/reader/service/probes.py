"""Talking to running reader-service servers from tests, plaintext or TLS, with or without a token."""

import collections
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import reader
from reader.service import DispatchServer, WorkerConfig, WorkerServer
from reader.service.auth import bearer
from reader.service.dispatcher import JOURNAL
from reader.service.rpc import DispatcherStub
from schemas.service_pb2 import Empty, JobRequest
from tests import helpers


def channel(target: str, ca: str | None = None) -> grpc.Channel:
    """A channel to ``grpc://host:port``; TLS verified against the PEM file ``ca`` when given."""
    address = target.removeprefix("grpc://")
    if ca is None:
        return grpc.insecure_channel(address)
    with open(ca, "rb") as handle:
        return grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=handle.read()))


def status(target: str, *, ca: str | None = None, token: str | None = None) -> dict:
    """The dispatcher's status. Waits for it to be reachable (up to 10 s): a new server can get the port of
    one a test just stopped, whose failed connection gRPC's shared subchannel still reports for a moment."""
    with channel(target, ca) as open_channel:
        stub = DispatcherStub(open_channel)
        return json.loads(stub.Status(Empty(), timeout=10, metadata=bearer(token), wait_for_ready=True).json)


def wait_for_workers(target: str, count: int, *, ca: str | None = None, token: str | None = None, timeout=20):
    deadline = time.monotonic() + timeout
    while len(status(target, ca=ca, token=token)["workers"]) < count:
        assert time.monotonic() < deadline, f"only {status(target, ca=ca, token=token)['workers']} registered"
        time.sleep(0.1)


def health(target: str, *, ca: str | None = None) -> int:
    """The standard health check's status for the whole server (service "")."""
    with channel(target, ca) as open_channel:
        request = health_pb2.HealthCheckRequest(service="")
        return health_pb2_grpc.HealthStub(open_channel).Check(request, timeout=5).status


def start_process(*args: str) -> tuple[subprocess.Popen, str, str]:
    """A ``python -m reader.service`` process: (process, target, health target) from its first two lines."""
    process = subprocess.Popen(
        [sys.executable, "-m", "reader.service", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=helpers.cli_env(),
    )
    serving, health_line = process.stdout.readline(), process.stdout.readline()
    assert serving.startswith("serving on") and health_line.startswith("health on"), process.stderr.read()[-2000:]
    return process, serving.split()[-1], health_line.split()[-1]


def ids_of(dataset) -> collections.Counter:
    """How often each id arrived over a whole iteration of ``dataset`` (any number of replicas)."""
    return collections.Counter(
        i for step in dataset for b in (step if isinstance(step, list) else [step]) for i in b["id"].tolist()
    )


def journal(work_dir: str) -> list[dict]:
    """The events a dispatcher with ``--work_dir=work_dir`` journaled, in order."""
    with open(os.path.join(work_dir, JOURNAL)) as handle:
        return [json.loads(line) for line in handle]


def job_request(snapshot_path: str, consumer: str, mode: str = "distributed_epoch", **leasing) -> JobRequest:
    """A GetJob request of job "tests" (seed 7, epoch 0) over ``snapshot_path`` for ``consumer``."""
    snapshot = reader.open_snapshot(snapshot_path)
    return JobRequest(
        job_name="tests",
        iteration=0,
        snapshot=snapshot.path,
        run_id=snapshot.metadata.run_id,
        processing_mode=mode,
        consumer=consumer,
        seed=7,
        **leasing,
    )


@contextlib.contextmanager
def with_two_workers(dispatcher: DispatchServer) -> Iterator[list[WorkerServer]]:
    """Two workers registered with the started ``dispatcher``; on exit they stop, then the dispatcher."""
    workers = [WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target)).start() for _ in range(2)]
    try:
        wait_for_workers(dispatcher.target, 2)
        yield workers
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()
