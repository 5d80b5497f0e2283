"""Worker streams under load: backpressure from a slow consumer, and draining on stop."""

import json
import signal
import threading
import time

import numpy as np
import pyarrow.flight as flight
import pytest
from grpc_health.v1 import health_pb2

import reader
from reader.service import DispatchServer, WorkerConfig, WorkerServer
from tests import helpers
from tests.reader.service.probes import health, start_process, wait_for_workers

ROWS, ROW_BYTES = 8192, 4096  # 32 MiB
SNAPSHOT_BYTES = ROWS * ROW_BYTES


@pytest.fixture(scope="module")
def big_snapshot(tmp_path_factory):
    """32 MiB of uncompressed 4 KiB rows in 256 KiB blocks: far more than gRPC's flow-control windows."""
    ids = np.arange(ROWS, dtype=np.int64)
    payload = np.repeat((ids % 251).astype(np.uint8)[:, None], ROW_BYTES, axis=1)
    batches = [{"id": ids[s : s + 512], "payload": payload[s : s + 512]} for s in range(0, ROWS, 512)]
    root = tmp_path_factory.mktemp("big")
    return helpers.write_snapshot(
        root, "big", batches, compression="NONE", block_size_bytes=256 << 10, shard_size_bytes=8 << 20
    )


def anonymous_rss_bytes(pid: int) -> int:
    """Heap and other anonymous memory: what buffering streams would grow (not mapped libraries)."""
    with open(f"/proc/{pid}/status") as handle:
        fields = dict(line.split(":", 1) for line in handle)
    return int(fields["RssAnon"].split()[0]) * 1024


def test_a_slow_consumer_bounds_worker_memory_and_does_not_hold_up_a_fast_one(big_snapshot):
    dispatcher = DispatchServer().start()
    workers = [start_process("worker", f"--dispatcher={dispatcher.target}")[0] for _ in range(2)]
    slow_rows, slow_started, stop_slow = [0], threading.Event(), threading.Event()
    try:
        wait_for_workers(dispatcher.target, 2)
        warm_up = reader.distributed_dataset(
            big_snapshot,
            256,
            service=reader.ServiceOptions(
                address=dispatcher.target, processing_mode="parallel_epochs", job_name="warm-up"
            ),
        )
        # Both workers pay their one-time costs (allocator arenas, open shards) before the baseline.
        assert sum(len(step["id"]) for step in warm_up) == ROWS * len(workers)
        baseline = [anonymous_rss_bytes(worker.pid) for worker in workers]
        peak = list(baseline)

        def sample():
            while not stop_slow.is_set():
                for index, worker in enumerate(workers):
                    peak[index] = max(peak[index], anonymous_rss_bytes(worker.pid))
                time.sleep(0.01)

        def slow():
            dataset = reader.distributed_dataset(
                big_snapshot,
                32,
                service=reader.ServiceOptions(
                    address=dispatcher.target, processing_mode="parallel_epochs", job_name="slow"
                ),
            )
            iterator = iter(dataset)
            for step in iterator:
                slow_rows[0] += len(step["id"])
                slow_started.set()
                if stop_slow.wait(0.1):
                    break
            iterator.close()

        threads = [threading.Thread(target=sample), threading.Thread(target=slow)]
        for thread in threads:
            thread.start()
        assert slow_started.wait(20), "the slow consumer never got a step"

        fast = reader.distributed_dataset(
            big_snapshot, 256, service=reader.ServiceOptions(address=dispatcher.target, job_name="fast")
        )
        assert sum(len(step["id"]) for step in fast) == ROWS
        slow_at_the_end = slow_rows[0]
        stop_slow.set()
        for thread in threads:
            thread.join(timeout=30)

        slow_epoch = ROWS * len(workers)  # parallel_epochs: every worker streams all of it
        assert slow_at_the_end < slow_epoch / 4, f"the fast job waited for the slow one ({slow_at_the_end} rows)"
        growth = [after - before for before, after in zip(baseline, peak, strict=True)]
        # Without backpressure each worker would buffer the rest of the slow stream (~SNAPSHOT_BYTES, seen
        # at 25 MB); with it, a worker holds what is in flight: the fast consumer's read-ahead (8 splits of
        # ~1 MiB over 2 workers, each read, shuffled and serialized) plus a few chunks of the slow stream.
        assert max(growth) < SNAPSHOT_BYTES / 2, f"workers grew by {growth} bytes while a consumer lagged"
    finally:
        stop_slow.set()
        for worker in workers:
            worker.terminate()
        assert [worker.wait(timeout=30) for worker in workers] == [0, 0]
        dispatcher.stop()


def _parallel_ticket(snapshot_path: str) -> dict:
    """The fields of a parallel_epochs ticket for ``snapshot_path`` (seed 1, epoch 0, batches of 64)."""
    run_id = reader.open_snapshot(snapshot_path).metadata.run_id
    return {
        "snapshot": snapshot_path,
        "run_id": run_id,
        "mode": "parallel_epochs",
        "seed": 1,
        "iteration": 0,
        "batch_rows": 64,
    }


def test_a_stopping_worker_turns_not_serving_refuses_new_streams_and_finishes_those_in_flight(big_snapshot):
    dispatcher = DispatchServer().start()
    worker = WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target)).start()
    fields = _parallel_ticket(big_snapshot)
    ticket = flight.Ticket(json.dumps(fields).encode())
    try:
        assert health(worker.health_target) == health_pb2.HealthCheckResponse.SERVING
        with flight.connect(worker.target) as client:
            stream = client.do_get(ticket)
            rows = stream.read_chunk().data.num_rows
            stopping = threading.Thread(target=worker.stop)
            stopping.start()
            deadline = time.monotonic() + 10
            while health(worker.health_target) != health_pb2.HealthCheckResponse.NOT_SERVING:
                assert time.monotonic() < deadline, "health still SERVING while stopping"
                time.sleep(0.05)
            assert stopping.is_alive(), "stop() returned with a stream still in flight"
            # Refused either by the worker (UNAVAILABLE, "draining") or, once Flight's shutdown has begun, by
            # gRPC (CANCELLED): consumers take both as "ask another worker" (worker_clients._WORKER_GONE).
            refused = (flight.FlightUnavailableError, flight.FlightCancelledError)
            with flight.connect(worker.target) as late, pytest.raises(refused):
                late.do_get(ticket, flight.FlightCallOptions(timeout=5)).read_all()
            rows += sum(chunk.data.num_rows for chunk in stream)
        assert rows == ROWS, "the stream in flight was finished, not cut"
        stopping.join(timeout=20)
        assert not stopping.is_alive()
    finally:
        worker.stop()
        dispatcher.stop()


def test_a_consumer_that_stops_reading_without_closing_holds_a_draining_worker_only_so_long(big_snapshot):
    dispatcher = DispatchServer().start()
    worker, target, _ = start_process("worker", f"--dispatcher={dispatcher.target}", "--drain_seconds=1")
    fields = _parallel_ticket(big_snapshot)
    try:
        with flight.connect(target) as client:
            stream = client.do_get(flight.Ticket(json.dumps(fields).encode()))
            assert stream.read_chunk().data.num_rows  # then it stops reading, stream open
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=60) == 0, "the drain waited for a consumer that will never read"
        assert "streams still open after draining 1 s" in worker.stderr.read()
    finally:
        if worker.poll() is None:
            worker.kill()
        dispatcher.stop()
