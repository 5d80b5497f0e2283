"""The reader service with real servers on loopback: seed 002's semantics, sharing, failures, safety."""

import collections
import json
import logging
import os
import signal
import threading
import time

import grpc
import pyarrow.flight as flight
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

import reader
from reader.service import DispatcherConfig, DispatchServer, ServerSecurity, WorkerConfig, WorkerServer, runs
from reader.service.client import epoch_reads
from reader.service.rpc import DispatcherStub
from schemas.service_pb2 import JobRequest, LeaseRequest, WorkerHeartbeat
from tests import helpers
from tests.reader.service.probes import ids_of, start_process, status, wait_for_workers


def test_parallel_epochs_every_worker_produces_everything(cluster, range_root):
    dispatcher, _ = cluster
    counts = ids_of(
        reader.distributed_dataset(
            range_root / "range10",
            4,
            service=reader.ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs"),
        )
    )
    assert counts == {i: 2 for i in range(10)}  # seed 002: 10 rows, 2 workers -> each row twice


def test_distributed_epoch_every_row_exactly_once(cluster, range_root, uneven_snapshot):
    dispatcher, _ = cluster
    assert ids_of(reader.distributed_dataset(range_root / "range10", 4, service=dispatcher.target)) == {
        i: 1 for i in range(10)
    }
    dataset = reader.distributed_dataset(uneven_snapshot, 64, num_replicas=2, service=dispatcher.target, num_epochs=2)
    steps = list(dataset)
    assert all(len(step) == 2 for step in steps)
    assert sum(1 for step in steps if len(step[0]["id"]) != 32) == 2, "one partial step per epoch (2000 % 64)"
    counts = collections.Counter(i for step in steps for b in step for i in b["id"].tolist())
    assert counts == {i: 2 for i in range(2000)}
    assert steps[0][0]["image"].shape == (32, 4, 4, 3)


def test_consumers_sharing_a_job_name_split_the_epoch_and_a_late_one_gets_an_empty_epoch(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    shared = reader.ServiceOptions(address=dispatcher.target, job_name="shared")
    results = helpers.read_at_once(lambda: ids_of(reader.distributed_dataset(uneven_snapshot, 50, service=shared)), 3)
    total = sum(results, collections.Counter())
    assert total == {i: 1 for i in range(2000)}
    assert sum(1 for counts in results if counts) >= 2, "first-come first-served between consumers"
    late = reader.distributed_dataset(
        uneven_snapshot, 50, service=reader.ServiceOptions(address=dispatcher.target, job_name="shared")
    )
    assert list(late) == []
    next_epoch = reader.distributed_dataset(
        uneven_snapshot, 50, num_epochs=2, service=reader.ServiceOptions(address=dispatcher.target, job_name="shared")
    )
    assert sum(ids_of(next_epoch).values()) == 2000, "epoch 0 was taken; epoch 1 is a new job"


def test_a_dead_consumers_splits_go_to_the_others_and_the_wait_for_them_is_logged(
    cluster, uneven_snapshot, monkeypatch, caplog
):
    dispatcher, _ = cluster
    snapshot = reader.open_snapshot(uneven_snapshot)
    with grpc.insecure_channel(dispatcher.target.removeprefix("grpc://")) as channel:
        stub = DispatcherStub(channel)
        job = stub.GetJob(
            JobRequest(
                job_name="j",
                iteration=0,
                snapshot=snapshot.path,
                run_id=snapshot.metadata.run_id,
                processing_mode="distributed_epoch",
                consumer="doomed",
                seed=3,
            ),
            timeout=10,
        )
        for _ in range(3):  # leases three splits, then "dies": never acks, never renews
            assert stub.LeaseSplit(LeaseRequest(job_id=job.job_id, consumer="doomed"), timeout=10).splits
    monkeypatch.setattr(epoch_reads, "WAIT_LOGGED_SECONDS", 0.5)  # the leases lapse after 2 s
    survivor = reader.distributed_dataset(
        uneven_snapshot, 50, seed=3, service=reader.ServiceOptions(address=dispatcher.target, job_name="j")
    )
    with caplog.at_level(logging.WARNING, logger=epoch_reads.__name__):
        assert ids_of(survivor) == {i: 1 for i in range(2000)}
    (waited,) = [record.getMessage() for record in caplog.records if "waiting for theirs" in record.getMessage()]
    assert "a consumer that stopped frees its splits when its lease lapses, within 2 s" in waited


def test_a_worker_stopping_mid_epoch_loses_and_duplicates_nothing(cluster, uneven_snapshot):
    dispatcher, workers = cluster
    iterator = iter(reader.distributed_dataset(uneven_snapshot, 20, service=dispatcher.target))
    seen = collections.Counter()
    for _ in range(10):
        seen.update(next(iterator)["id"].tolist())
    workers[0].stop()
    for step in iterator:
        seen.update(step["id"].tolist())
    assert seen == {i: 1 for i in range(2000)}


def test_kill_9_of_a_worker_process_and_a_dispatcher_restart_keep_exactly_once(uneven_snapshot, tmp_path):
    work_dir = str(tmp_path / "journal")
    dispatcher, target, _ = start_process("dispatcher", "--port=0", f"--work_dir={work_dir}", "--lease_seconds=5")
    port = target.rsplit(":", 1)[1]
    workers = [start_process("worker", f"--dispatcher={target}")[0] for _ in range(2)]
    try:
        time.sleep(2.5)
        iterator = iter(reader.distributed_dataset(uneven_snapshot, 20, service=target))
        seen = collections.Counter()
        for _ in range(20):
            seen.update(next(iterator)["id"].tolist())
        workers[0].send_signal(signal.SIGKILL)
        for _ in range(20):
            seen.update(next(iterator)["id"].tolist())
        dispatcher.send_signal(signal.SIGKILL)
        dispatcher.wait()
        dispatcher, _, _ = start_process("dispatcher", f"--port={port}", f"--work_dir={work_dir}", "--lease_seconds=5")
        for step in iterator:
            seen.update(step["id"].tolist())
        assert seen == {i: 1 for i in range(2000)}
    finally:
        for process in [dispatcher, *workers]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        assert dispatcher.wait(timeout=30) == 0, "SIGTERM drains and exits 0"
        for process in workers:
            process.wait(timeout=30)


def test_roots_outside_allowed_are_refused_and_bad_requests_do_not_stop_the_server(range_root, tmp_path):
    dispatcher = DispatchServer(DispatcherConfig(allowed_roots=[str(tmp_path)])).start()
    worker = WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target, allowed_roots=[str(tmp_path)])).start()
    try:
        wait_for_workers(dispatcher.target, 1)
        with pytest.raises(reader.UsageError, match="allowed_roots"):
            list(reader.distributed_dataset(range_root / "range10", 4, service=dispatcher.target))
        with grpc.insecure_channel(dispatcher.target.removeprefix("grpc://")) as channel:
            with pytest.raises(grpc.RpcError) as error:
                DispatcherStub(channel).Heartbeat(WorkerHeartbeat(address="not-a-url"), timeout=5)
            assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        fields = {"snapshot": str(tmp_path), "run_id": "r", "mode": "parallel_epochs", "seed": 0, "iteration": 0}
        for bad in (
            b"not json",
            json.dumps(fields).encode(),  # no batch_rows: a consumer of another version
            json.dumps({**fields, "batch_rows": 64, "head": 64}).encode(),
            json.dumps({**fields, "batch_rows": 0}).encode(),
        ):
            with flight.connect(worker.target) as client, pytest.raises(flight.FlightServerError, match="malformed"):
                client.do_get(flight.Ticket(bad), flight.FlightCallOptions(timeout=10)).read_all()
        assert status(dispatcher.target)["workers"] == [worker.target]
    finally:
        worker.stop()
        dispatcher.stop()
        dispatcher.stop()  # idempotent


def _refusals(dispatcher, worker, snapshot: str, run_id: str = "") -> tuple[grpc.StatusCode, type | None, str]:
    """What the dispatcher (GetJob) and the worker (a stream) answer for ``snapshot`` (run ``run_id``).

    (the dispatcher's status code, the worker's Flight error class or None, both messages).
    """
    request = JobRequest(
        job_name=f"roots-{time.monotonic_ns()}",
        snapshot=snapshot,
        run_id=run_id,
        processing_mode="distributed_epoch",
        consumer="c",
    )
    with grpc.insecure_channel(dispatcher.target.removeprefix("grpc://")) as channel:
        try:
            DispatcherStub(channel).GetJob(request, timeout=30)
            code, message = grpc.StatusCode.OK, ""
        except grpc.RpcError as exc:
            code, message = exc.code(), exc.details()
    ticket = flight.Ticket(
        json.dumps(
            {
                "snapshot": snapshot,
                "run_id": run_id,
                "mode": "parallel_epochs",
                "seed": 0,
                "iteration": 0,
                "batch_rows": 64,
            }
        )
    )
    with flight.connect(worker.target) as client:
        try:
            client.do_get(ticket, flight.FlightCallOptions(timeout=30)).read_all()
            error = None
        except flight.FlightError as exc:
            error, message = type(exc), f"{message} | {exc}"
    return code, error, message


def test_allowed_roots_are_folders_with_dots_and_symlinks_resolved(range_root, uneven_snapshot, tmp_path):
    """Through the real servers: a root admits itself and what is inside it after resolving, nothing else."""
    root = tmp_path / "snap"
    root.mkdir()
    (root / "escape").symlink_to(uneven_snapshot)  # inside the root by name, outside by target
    (tmp_path / "into-root").symlink_to(range_root / "range10")  # outside by name, inside by target
    (tmp_path / "snapshots").mkdir()
    dispatcher = DispatchServer(DispatcherConfig(allowed_roots=[str(range_root), str(root)])).start()
    worker = WorkerServer(
        WorkerConfig(dispatcher_address=dispatcher.target, allowed_roots=[f"{range_root}/", str(root)])
    ).start()
    try:
        run_id = reader.open_snapshot(range_root / "range10").metadata.run_id
        for inside in (range_root / "range10", f"{range_root}/x/../range10", tmp_path / "into-root"):
            assert _refusals(dispatcher, worker, str(inside), run_id) == (grpc.StatusCode.OK, None, ""), inside
        for outside in (
            f"{root}/../snapshots",  # /x/snap/../snapshots
            str(tmp_path / "snapshots"),  # /x/snapshots is not within /x/snap
            str(root / "escape"),
            str(uneven_snapshot),
            f"gs://bucket{range_root}/range10",
        ):
            code, error, message = _refusals(dispatcher, worker, outside)
            assert (code, error) == (grpc.StatusCode.PERMISSION_DENIED, flight.FlightUnauthorizedError), outside
            assert outside in message and os.path.realpath(root) in message and "add its root to" in message
    finally:
        worker.stop()
        dispatcher.stop()


def test_allowed_roots_as_uri_prefixes_admit_only_their_scheme_bucket_and_folder(range_root, monkeypatch):
    """``--allowed_roots=s3://bucket/snaps`` through the real servers, with no store running.

    ``open_snapshot`` stands in for the store (an emulator bucket comes later):
    it records the path it was given and fails as an unreachable store would,
    so an admitted URI ends in FAILED_PRECONDITION, never PERMISSION_DENIED,
    and reaches the store as a URI (not ``<cwd>/s3:/...``).
    """
    from schemas.errors import StorageError

    opened = []

    def no_store(path):
        opened.append(path)
        raise StorageError(f"cannot reach the store for {path} (none runs in this test)")

    monkeypatch.setattr(runs, "open_snapshot", no_store)
    dispatcher = DispatchServer(DispatcherConfig(allowed_roots=["s3://bucket/snaps"])).start()
    worker = WorkerServer(
        WorkerConfig(dispatcher_address=dispatcher.target, allowed_roots=["S3://bucket/snaps/"])
    ).start()
    try:
        for inside in ("s3://bucket/snaps/x", "S3://bucket//snaps/./y/../x/"):
            code, error, message = _refusals(dispatcher, worker, inside)
            assert code == grpc.StatusCode.FAILED_PRECONDITION and error is flight.FlightServerError, message
            assert "cannot reach the store" in message
        assert opened == ["s3://bucket/snaps/x"] * 4, "the canonical URI is what is opened, by both servers"
        for outside in (
            "s3://bucket/other/x",
            "gs://bucket/snaps/x",
            "s3://bucket/snapshots/x",
            "s3://bucket-2/snaps/x",
            "s3://bucket/snaps/../other/x",
            "s3://bucket/snaps/x?endpoint_override=elsewhere:9000",
            str(range_root / "range10"),
        ):
            code, error, message = _refusals(dispatcher, worker, outside)
            assert (code, error) == (grpc.StatusCode.PERMISSION_DENIED, flight.FlightUnauthorizedError), outside
            assert outside in message and "s3://bucket/snaps" in message and "add its root to" in message
        code, error, message = _refusals(dispatcher, worker, "s3://bucket/../other/x")
        assert (code, error) == (grpc.StatusCode.INVALID_ARGUMENT, flight.FlightServerError)
        assert "climbs above its bucket s3://bucket" in message
        assert len(opened) == 4, "nothing outside the roots reached the store"
        assert status(dispatcher.target)["workers"] == [worker.target], "the servers keep serving"
    finally:
        worker.stop()
        dispatcher.stop()


@pytest.mark.parametrize("role", ["dispatcher", "worker"])
def test_an_allowed_root_above_its_bucket_is_a_usage_error(role, capsys):
    from reader.service.__main__ import main

    extra = ["--dispatcher=127.0.0.1:1"] if role == "worker" else []
    assert main([role, "--port=0", "--allowed_roots=gs://bucket/snaps,gs://bucket/../x", *extra]) == 2
    error = capsys.readouterr().err
    assert f"usage error: {role} --allowed_roots: gs://bucket/../x climbs above its bucket gs://bucket" in error


def test_unreachable_dispatcher_is_a_clear_error(range_root):
    from reader.service.client import connection

    with pytest.raises(connection.ServiceUnavailableError, match="unreachable"):
        list(
            reader.distributed_dataset(
                range_root / "range10",
                4,
                service=reader.ServiceOptions(address="grpc://127.0.0.1:1", timeout_seconds=1),
            )
        )
    with pytest.raises(reader.UsageError, match="grpc://"):
        reader.distributed_dataset(range_root / "range10", 4, service="127.0.0.1:1")
    assert os.path.exists(range_root / "range10")


@pytest.fixture
def token_cluster(tmp_path):
    """``(token, dispatcher, worker)``: a dispatcher and a worker that both require the token from a token file."""
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    from reader.service.auth import read_token_file

    token = read_token_file(str(token_file))
    dispatcher = DispatchServer(DispatcherConfig(security=ServerSecurity(auth_token=token))).start()
    worker = WorkerServer(
        WorkerConfig(dispatcher_address=dispatcher.target, security=ServerSecurity(auth_token=token))
    ).start()
    try:
        wait_for_workers(dispatcher.target, 1, token=token)
        yield token, dispatcher, worker
    finally:
        worker.stop()
        dispatcher.stop()


def test_a_workers_port_as_service_names_the_dispatcher_to_use(range_root, token_cluster):
    """Before, a worker's port gave gRPC's raw UNIMPLEMENTED; the worker now names its dispatcher, with a token too."""
    token, dispatcher, worker = token_cluster
    snapshot = range_root / "range10"
    with pytest.raises(reader.UsageError) as error:
        list(
            reader.distributed_dataset(
                snapshot, 4, service=reader.ServiceOptions(address=worker.target, auth_token=token)
            )
        )
    assert str(error.value) == (
        f"service={worker.target} is not a snapfeed dispatcher (UNIMPLEMENTED dispatcher calls): it is a "
        f"snapfeed worker's port; give its dispatcher, service='{dispatcher.target}'"
    )
    for elsewhere in (worker.health_target, worker.target):  # a port serving only health; a worker, no token
        with pytest.raises(reader.UsageError, match="not a snapfeed dispatcher.*printed") as error:
            list(reader.distributed_dataset(snapshot, 4, service=f"grpc://{elsewhere.removeprefix('grpc://')}"))
    steps = list(
        reader.distributed_dataset(
            snapshot, 4, service=reader.ServiceOptions(address=dispatcher.target, auth_token=token)
        )
    )
    assert sum(len(step["id"]) for step in steps) == 10


def test_auth_token_is_required_on_dispatcher_and_workers(range_root, token_cluster):
    token, dispatcher, worker = token_cluster
    with pytest.raises(reader.UsageError, match="auth token"):
        list(reader.distributed_dataset(range_root / "range10", 4, service=dispatcher.target))
    ok = reader.distributed_dataset(
        range_root / "range10", 4, service=reader.ServiceOptions(address=dispatcher.target, auth_token=token)
    )
    assert ids_of(ok) == {i: 1 for i in range(10)}
    with flight.connect(worker.target) as client, pytest.raises(flight.FlightUnauthenticatedError):
        client.do_get(flight.Ticket(b"{}")).read_all()
    with grpc.insecure_channel(dispatcher.target.removeprefix("grpc://")) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING, "health stays open for probes"


def test_status_command_shows_workers_and_jobs(cluster, range_root, capsys):
    from reader.service.__main__ import main

    dispatcher, workers = cluster
    list(
        reader.distributed_dataset(
            range_root / "range10", 4, service=reader.ServiceOptions(address=dispatcher.target, job_name="visible")
        )
    )
    assert main(["status", f"--dispatcher={dispatcher.target}"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert sorted(shown["workers"]) == sorted(w.target for w in workers)
    (job,) = [j for j in shown["jobs"] if j["job_name"] == "visible"]
    assert job["finished"] and job["splits"]["done"] == job["splits"]["done"] + job["splits"]["pending"] > 0


def test_200_concurrent_consumers_are_served(cluster, range_root):
    dispatcher, _ = cluster
    errors, totals = [], collections.Counter()
    lock = threading.Lock()

    def consume():
        try:
            counts = ids_of(reader.distributed_dataset(range_root / "range10", 5, service=dispatcher.target))
            with lock:
                totals.update(counts)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(repr(exc))

    threads = [threading.Thread(target=consume) for _ in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert errors == [] and totals == {i: 200 for i in range(10)}
