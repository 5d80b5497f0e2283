"""A snapshot rewritten (``--mode=write``) under a running service is read as its new run, never the old one."""

import gc
import json
import os
import threading

import pyarrow.flight as flight
import pytest

import reader
from reader.service import WorkerConfig, WorkerServer, runs
from reader.service import worker as worker_module
from tests import helpers
from tests.reader.service.probes import ids_of, wait_for_workers


def write_ids(root, name: str, first: int, sizes: list[int]) -> str:
    """Snapshot ``name`` holding ids ``first``.. in batches of ``sizes`` (a second call rewrites it)."""
    batches = helpers.id_batches(sizes)
    for batch in batches:
        batch["id"] += first
    return helpers.write_snapshot(root, name, batches, block_size_bytes=600, shard_size_bytes=6_000)


def ticket(path: str, run_id: str) -> flight.Ticket:
    return flight.Ticket(
        json.dumps(
            {"snapshot": path, "run_id": run_id, "mode": "parallel_epochs", "seed": 1, "iteration": 0, "batch_rows": 64}
        )
    )


def open_files_under(directory: str) -> list[str]:
    """Files of this process's descriptors that lie under ``directory``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(directory + os.sep):
            found.append(target)
    return found


def test_a_rewritten_snapshot_is_read_as_its_new_run_by_a_running_cluster(cluster, tmp_path):
    dispatcher, workers = cluster
    path = write_ids(tmp_path, "rewritten", 0, [300, 200])
    stale = reader.distributed_dataset(
        path, 50, service=reader.ServiceOptions(address=dispatcher.target, job_name="stale")
    )
    assert ids_of(reader.distributed_dataset(path, 50, service=dispatcher.target)) == {i: 1 for i in range(500)}
    parallel = reader.distributed_dataset(
        path, 50, service=reader.ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs")
    )
    assert ids_of(parallel) == {i: 2 for i in range(500)}

    write_ids(tmp_path, "rewritten", 10_000, [700, 110, 90])  # --mode=write: a new run with other blocks
    new_run = {i: 1 for i in range(10_000, 10_900)}
    assert ids_of(reader.distributed_dataset(path, 50, service=dispatcher.target)) == new_run
    parallel = reader.distributed_dataset(
        path, 50, service=reader.ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs")
    )
    assert ids_of(parallel) == {i: 2 for i in new_run}

    # A consumer that opened the old run still reads it where the servers have it open (it stays until gc)...
    stale_rows = iter(stale)
    assert set(next(stale_rows)["id"].tolist()) <= set(range(500))
    stale_rows.close()
    # ...and where they do not, it is one clear error, not rows of another run.
    fresh = WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target)).start()
    try:
        for worker in workers:
            worker.stop()
        wait_for_workers(dispatcher.target, 1)
        with pytest.raises(reader.SnapfeedError, match=r"no longer the run of .*rewritten.*open it again"):
            list(stale)
    finally:
        fresh.stop()


def test_a_dispatcher_that_never_saw_the_old_run_refuses_it(cluster, tmp_path):
    dispatcher, _ = cluster
    path = write_ids(tmp_path, "replaced", 0, [100])
    stale = reader.distributed_dataset(path, 50, service=dispatcher.target)
    write_ids(tmp_path, "replaced", 5_000, [100])
    with pytest.raises(reader.SnapshotNotFoundError, match=r"run .* is no longer the run of .*replaced"):
        list(stale)


def test_a_worker_keeps_a_bounded_number_of_runs_open_and_closes_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(worker_module, "RUNS_KEPT", 1)
    worker = WorkerServer(
        WorkerConfig(dispatcher_address="grpc://127.0.0.1:1", drain_seconds=5)
    ).start()  # no dispatcher needed to stream a ticket
    try:
        path = write_ids(tmp_path, "bounded", 0, [200])
        first = reader.open_snapshot(path)
        with flight.connect(worker.target) as client:
            assert client.do_get(ticket(path, first.metadata.run_id)).read_all().num_rows == 200
            first_run_dir = os.path.dirname(first.shard_path(0))
            assert open_files_under(first_run_dir), "the worker keeps the run it serves open"
            write_ids(tmp_path, "bounded", 0, [150])
            second = reader.open_snapshot(path)
            assert client.do_get(ticket(path, second.metadata.run_id)).read_all().num_rows == 150
            with pytest.raises(flight.FlightServerError, match="no longer the run of"):
                client.do_get(ticket(path, first.metadata.run_id)).read_all()
        gc.collect()
        assert open_files_under(first_run_dir) == [], "the run it let go of is closed"
    finally:
        worker.stop()


def test_a_slow_snapshot_open_does_not_stall_other_streams(range_root, monkeypatch):
    slow_open, release = threading.Event(), threading.Event()
    opened = runs.open_snapshot

    def open_slowly(path, **kwargs):
        if path.endswith("range12"):
            slow_open.set()
            release.wait(30)
        return opened(path, **kwargs)

    monkeypatch.setattr(runs, "open_snapshot", open_slowly)
    worker = WorkerServer(WorkerConfig(dispatcher_address="grpc://127.0.0.1:1")).start()
    slow_rows = []
    try:
        slow_path, fast_path = str(range_root / "range12"), str(range_root / "range10")

        def read_slow():
            with flight.connect(worker.target) as client:
                slow_rows.append(client.do_get(ticket(slow_path, reader.open_snapshot(slow_path).metadata.run_id)))

        slow = threading.Thread(target=read_slow)
        slow.start()
        assert slow_open.wait(30)
        with flight.connect(worker.target) as client:
            fast = client.do_get(ticket(fast_path, reader.open_snapshot(fast_path).metadata.run_id)).read_all()
        assert fast.num_rows == 10 and not release.is_set(), "served while another snapshot was still opening"
        release.set()
        slow.join(timeout=30)
        assert slow_rows[0].read_all().num_rows == 12
    finally:
        release.set()
        worker.stop()


def test_a_bounded_cache_opens_each_key_once_forgets_failures_and_evicts_the_oldest():
    cache = runs.BoundedCache(2)
    made = []

    def make(value):
        def build():
            made.append(value)
            return value

        return build

    assert cache.get("a", make(1)) == 1 and cache.get("a", make(99)) == 1
    with pytest.raises(ValueError):
        cache.get("b", lambda: int("not a number"))
    assert cache.get("b", make(2)) == 2, "a failed open is not remembered"
    cache.get("a", make(99))  # "a" is now the most recently used
    assert cache.get("c", make(3)) == 3
    assert cache.get("a", make(99)) == 1 and cache.get("b", make(4)) == 4, "b was the oldest: evicted"
    assert made == [1, 2, 3, 4]
