"""Prometheus metrics of a real dispatcher and workers, scraped over HTTP while they serve real epochs."""

import collections
import signal
import socket
import time
import urllib.error
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import reader
from reader.core.plan import all_blocks
from reader.service import DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer, splits
from reader.service.rpc import DispatcherStub
from schemas.errors import UsageError
from schemas.service_pb2 import LeaseRequest
from tests import helpers
from tests.reader.service.probes import ids_of, job_request, start_process, wait_for_workers

ROW_BYTES = 8 + 4 * 4 * 3 + 4  # id, image, value of helpers.id_batches
DISTRIBUTED = {"processing_mode": "distributed_epoch"}


class Scrape:
    """One scrape of ``target``: ``scrape(name, **labels)`` adds up the samples of ``name`` with those labels."""

    def __init__(self, target: str) -> None:
        with urllib.request.urlopen(target, timeout=10) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
        self.samples = [sample for family in text_string_to_metric_families(text) for sample in family.samples]

    def __call__(self, name: str, **labels: str) -> float:
        matching = [s.value for s in self.samples if s.name == name and labels.items() <= s.labels.items()]
        assert matching, f"no {name} {labels}"
        return sum(matching)


def _total(targets: list[str], name: str, **labels: str) -> float:
    return sum(Scrape(target)(name, **labels) for target in targets)


@pytest.fixture(scope="module")
def plain_snapshot(tmp_path_factory):
    """2000 fixed-width rows, uncompressed (workers read them directly), in blocks of about 10 rows: 7 splits."""
    root = tmp_path_factory.mktemp("metered")
    batches = helpers.id_batches([500] * 4)
    return helpers.write_snapshot(root, "metered", batches, compression="NONE", block_size_bytes=600)


def _splits_of(path: str) -> int:
    return splits.split_count(all_blocks(reader.open_snapshot(path).block_rows))


@pytest.fixture
def metered(tmp_path):
    """A journaling dispatcher with 2 s leases and two workers, each serving metrics on a port of its own."""
    dispatcher = DispatchServer(
        DispatcherConfig(work_dir=str(tmp_path / "journal"), lease_seconds=2, metrics_port=0)
    ).start()
    workers = [
        WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target, metrics_port=0)).start() for _ in range(2)
    ]
    try:
        wait_for_workers(dispatcher.target, 2)
        yield dispatcher, workers
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()


def test_the_metrics_of_an_epoch_are_what_the_consumer_read(metered, plain_snapshot, tmp_path):
    dispatcher, workers = metered
    worker_targets = [worker.metrics_target for worker in workers]
    iterator = iter(
        reader.distributed_dataset(
            plain_snapshot, 64, service=reader.ServiceOptions(address=dispatcher.target, job_name="metered")
        )
    )
    assert ids_of(iterator) == {i: 1 for i in range(2000)}
    stats = iterator.stats()
    assert (stats.rows, stats.bytes) == (2000, 2000 * ROW_BYTES)
    served = _total(worker_targets, "snapfeed_worker_served_rows_total", **DISTRIBUTED)
    assert served == stats.rows
    assert _total(worker_targets, "snapfeed_worker_served_bytes_total", **DISTRIBUTED) == stats.bytes
    assert _total(worker_targets, "snapfeed_worker_storage_read_bytes_total") == 2000 * ROW_BYTES, "direct reads"
    num_splits = _splits_of(plain_snapshot)
    assert num_splits == 7
    assert _total(worker_targets, "snapfeed_worker_streams_total", **DISTRIBUTED) == num_splits
    for target, worker in zip(worker_targets, workers, strict=True):
        scraped = _no_stream_open(target)
        assert scraped("snapfeed_worker_served_rows_total", worker=worker.target) > 0, "splits go round-robin"
        assert scraped("snapfeed_worker_streams_open") == 0
        assert scraped("snapfeed_worker_streams_resumed_total") == 0
        assert scraped("snapfeed_worker_stream_errors_total") == 0
        assert scraped("snapfeed_worker_draining") == 0

    job = {"job": "metered", **DISTRIBUTED}
    scraped = Scrape(dispatcher.metrics_target)
    assert scraped("snapfeed_dispatcher_splits_leased_total", **job) == num_splits
    assert scraped("snapfeed_dispatcher_splits_delivered_total", **job) == num_splits
    assert scraped("snapfeed_dispatcher_splits_released_total", **job) == 0
    assert scraped("snapfeed_dispatcher_lease_expiries_total", **job) == 0
    assert scraped("snapfeed_dispatcher_epochs_total", **job) == 1
    assert scraped("snapfeed_dispatcher_epochs_finished_total", **job) == 1
    assert scraped("snapfeed_dispatcher_consumers", **job) == 1
    assert scraped("snapfeed_dispatcher_workers") == 2
    journal = tmp_path / "journal" / "dispatcher.journal.jsonl"
    assert scraped("snapfeed_dispatcher_journal_bytes") == journal.stat().st_size > 0
    assert 0 <= scraped("snapfeed_dispatcher_recovery_seconds") < 5

    parallel = reader.distributed_dataset(
        plain_snapshot,
        64,
        service=reader.ServiceOptions(
            address=dispatcher.target, processing_mode="parallel_epochs", job_name="broadcast"
        ),
    )
    assert ids_of(parallel) == {i: 2 for i in range(2000)}, "every worker's whole epoch"
    for target in worker_targets:
        assert Scrape(target)("snapfeed_worker_served_rows_total", processing_mode="parallel_epochs") == 2000
    scraped = Scrape(dispatcher.metrics_target)
    parallel_job = {"job": "broadcast", "processing_mode": "parallel_epochs"}
    assert scraped("snapfeed_dispatcher_epochs_finished_total", **parallel_job) == 1
    assert scraped("snapfeed_dispatcher_consumers", **parallel_job) == 1
    assert scraped("snapfeed_dispatcher_epochs_total") == 2


def test_unnamed_consumers_jobs_add_up_under_one_series(metered, plain_snapshot):
    dispatcher, _ = metered
    for _ in range(2):
        assert ids_of(reader.distributed_dataset(plain_snapshot, 64, service=dispatcher.target)) == {
            i: 1 for i in range(2000)
        }
    scraped = Scrape(dispatcher.metrics_target)
    assert {s.labels["job"] for s in scraped.samples if s.name == "snapfeed_dispatcher_epochs_total"} == {"anonymous"}
    assert scraped("snapfeed_dispatcher_epochs_finished_total", job="anonymous", **DISTRIBUTED) == 2
    assert scraped("snapfeed_dispatcher_splits_delivered_total", job="anonymous") == 2 * _splits_of(plain_snapshot)


def test_a_lost_consumers_splits_are_counted_as_expired_and_leased_again(metered, plain_snapshot):
    dispatcher, _ = metered
    with grpc.insecure_channel(dispatcher.target.removeprefix("grpc://")) as channel:
        stub = DispatcherStub(channel)
        job = stub.GetJob(job_request(plain_snapshot, "doomed"), timeout=10)
        for _ in range(3):  # leases three splits, then "dies": never acks, never renews
            assert stub.LeaseSplit(LeaseRequest(job_id=job.job_id, consumer="doomed"), timeout=10).splits
    survivor = reader.distributed_dataset(
        plain_snapshot, 64, seed=7, service=reader.ServiceOptions(address=dispatcher.target, job_name="tests")
    )
    assert ids_of(survivor) == {i: 1 for i in range(2000)}
    scraped = Scrape(dispatcher.metrics_target)
    num_splits = _splits_of(plain_snapshot)
    job = {"job": "tests", **DISTRIBUTED}
    assert scraped("snapfeed_dispatcher_lease_expiries_total", **job) == 3
    assert scraped("snapfeed_dispatcher_splits_released_total", **job) == 3
    assert scraped("snapfeed_dispatcher_splits_leased_total", **job) == num_splits + 3
    assert scraped("snapfeed_dispatcher_splits_delivered_total", **job) == num_splits
    assert scraped("snapfeed_dispatcher_consumers", **job) == 2


def _start_metered(*args: str):
    """A ``python -m reader.service`` process with ``--metrics_port=0``: (process, target, metrics target)."""
    process, target, _ = start_process(*args, "--metrics_port=0")
    line = process.stdout.readline()
    assert line.startswith("metrics on http://127.0.0.1:"), line
    return process, target, line.split()[-1]


def _quiet(target: str) -> Scrape:
    """A scrape of a worker once it sends nothing more (its consumer stopped reading: flow control holds it)."""
    before, deadline = Scrape(target), time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.3)
        after = Scrape(target)
        if after("snapfeed_worker_served_rows_total") == before("snapfeed_worker_served_rows_total"):
            return after
        before = after
    raise AssertionError(f"{target} kept sending")


def _no_stream_open(target: str) -> Scrape:
    """A scrape once the worker's streams ended: a consumer may stop reading a split once it has all its rows,
    a moment before the worker's side of the stream ends."""
    deadline = time.monotonic() + 10
    while (scraped := Scrape(target))("snapfeed_worker_streams_open") and time.monotonic() < deadline:
        time.sleep(0.1)
    return scraped


@pytest.mark.slow
def test_after_a_worker_is_killed_the_survivor_serves_the_rest_and_no_lease_is_lost(plain_snapshot):
    dispatcher, target, dispatcher_metrics = _start_metered("dispatcher", "--port=0", "--lease_seconds=5")
    workers = [_start_metered("worker", f"--dispatcher={target}") for _ in range(2)]
    try:
        wait_for_workers(target, 2)
        iterator = iter(
            reader.distributed_dataset(
                plain_snapshot, 20, service=reader.ServiceOptions(address=target, job_name="killed")
            )
        )
        seen = collections.Counter()
        for _ in range(10):
            seen.update(next(iterator)["id"].tolist())
        doomed = _quiet(workers[0][2])
        served_before = doomed("snapfeed_worker_served_rows_total", **DISTRIBUTED)
        assert served_before > 0 and doomed("snapfeed_worker_streams_total") > 0
        workers[0][0].send_signal(signal.SIGKILL)
        workers[0][0].wait()
        for step in iterator:
            seen.update(step["id"].tolist())
        assert seen == {i: 1 for i in range(2000)}

        survivor = _no_stream_open(workers[1][2])
        served_after = survivor("snapfeed_worker_served_rows_total", **DISTRIBUTED)
        assert served_before + served_after >= 2000, "every row the consumer got was served and counted"
        assert survivor("snapfeed_worker_stream_errors_total") == 0
        assert survivor("snapfeed_worker_streams_open") == 0
        job = {"job": "killed", **DISTRIBUTED}
        scraped = Scrape(dispatcher_metrics)
        num_splits = _splits_of(plain_snapshot)
        # a lost worker costs no lease: the consumer resumes its split on the survivor, from the rows it got
        assert scraped("snapfeed_dispatcher_splits_leased_total", **job) == num_splits
        assert scraped("snapfeed_dispatcher_splits_delivered_total", **job) == num_splits
        assert scraped("snapfeed_dispatcher_splits_released_total", **job) == 0
        assert scraped("snapfeed_dispatcher_epochs_finished_total", **job) == 1
    finally:
        for process in [dispatcher, *(worker[0] for worker in workers)]:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)


def test_metrics_are_off_by_default_and_a_port_in_use_is_refused():
    dispatcher = DispatchServer()
    worker = WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target))
    assert dispatcher.metrics_target is None and worker.metrics_target is None, "no HTTP listener"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=f"--metrics_port={port}: cannot serve metrics on 127.0.0.1:{port}"):
            WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target, metrics_port=port))
    worker.stop()
    dispatcher.stop()


def test_the_flag_on_the_command_line_a_port_in_use_is_one_error_line():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = helpers.run_module("reader.service", "dispatcher", "--port=0", f"--metrics_port={port}")
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert (
        f"--metrics_port={port}: cannot serve metrics on 127.0.0.1:{port} (Address already in use); give a free" in line
    )
    usage = helpers.run_module("reader.service", "worker", "--help").stdout.replace("\n", " ")
    assert "--metrics_port" in usage and "default: off" in " ".join(usage.split())
