"""The service's data path: splits streamed a batch at a time in delivery order, cut where the consumer cuts, and
the consumer's background calls (lease renewal, StreamsRead) saying what happened when."""

import collections
import logging

import numpy as np
import pyarrow.flight as flight
import pytest

import reader
from reader.core.blocks import BlockReader
from reader.core.plan import all_blocks
from reader.service import DispatcherConfig, DispatchServer, WorkerConfig, WorkerServer, splits
from reader.service.client.connection import ServiceConnection
from reader.service.client.cursor import Cursor, new_consumer
from reader.service.client.parallel_reads import parallel_batches
from reader.service.client.worker_clients import WorkerClients
from reader.service.delivery import DeliveryBatcher
from reader.service.options import ServiceOptions
from schemas.service_pb2 import JobRequest
from tests.reader.service.probes import status, wait_for_workers


@pytest.fixture
def one_worker():
    dispatcher = DispatchServer(DispatcherConfig(lease_seconds=2)).start()
    worker = WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target)).start()
    wait_for_workers(dispatcher.target, 1)
    yield dispatcher, worker
    worker.stop()
    dispatcher.stop()


def breaking_after(server, blocks: int, tickets: list[tuple[int, int, int]]):
    """Makes a worker's split streams fail (UNAVAILABLE) once ``blocks`` blocks were read; records
    (split, offset, head) of every ticket."""
    original = server._split_parts

    def split_parts(run, request):
        tickets.append((request.split, request.offset, request.head))
        for read, part in enumerate(original(run, request)):
            if read == blocks:
                raise flight.FlightUnavailableError("worker lost mid-split (test)")
            yield part

    server._split_parts = split_parts


def test_a_worker_failing_mid_split_is_replaced_from_the_rows_received_and_every_row_arrives_once(
    cluster, uneven_snapshot
):
    """A worker fails each split after 8 blocks (at least 24 rows: more than a batch of 20, so some were sent)."""
    dispatcher, workers = cluster
    failing, healthy = [], []
    batch, broken_after = 20, 8
    breaking_after(workers[0]._server, broken_after, failing)
    breaking_after(workers[1]._server, 10**9, healthy)  # records only
    dataset = reader.distributed_dataset(uneven_snapshot, batch, service=dispatcher.target, seed=5)
    counts = collections.Counter(i for step in dataset for i in step["id"].tolist())
    assert counts == {i: 1 for i in range(2000)}
    assert failing and {offset for _, offset, _ in failing} == {0}, "the failing worker was asked for fresh splits"
    resumed = [(split, offset, head) for split, offset, head in healthy if offset > 0]
    assert {split for split, *_ in resumed} == {split for split, *_ in failing}, "the healthy worker took them over"
    blocks = splits.job_blocks(all_blocks(reader.open_snapshot(uneven_snapshot).block_rows), 5, 0)
    failing_heads = {split: head for split, _, head in failing}
    for split, offset, head in resumed:
        read = sum(p.rows for p in splits.split_blocks(blocks, split)[:broken_after])
        first = failing_heads[split] or batch
        assert offset == first + (read - first) // batch * batch, "resumed after the whole batches the worker sent"
        assert head == (failing_heads[split] - offset) % batch, "the cut stays where the consumer cuts its batches"


def test_parallel_epochs_workers_send_their_seeded_order_in_the_consumers_batches_handed_out_as_they_came(
    one_worker, uneven_snapshot
):
    dispatcher, worker = one_worker
    snapshot = reader.open_snapshot(uneven_snapshot)
    dataset = reader.distributed_dataset(
        uneven_snapshot,
        64,
        seed=9,
        num_epochs=2,
        service=reader.ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs"),
    )
    got = [i for step in dataset for i in step["id"].tolist()]
    source = BlockReader(snapshot, ["id"], verify_checksums=False)
    expected = []
    for epoch in (0, 1):
        seed = splits.worker_seed(9, worker.target)
        blocks = splits.job_blocks(all_blocks(snapshot.block_rows), seed, epoch)
        for part in splits.stream_parts(blocks, 0, seed, epoch, 0):
            ids = source.read_arrow(part.piece).column(0).to_numpy()
            expected.extend(ids[part.order].tolist())
    assert sorted(expected) == sorted(list(range(2000)) * 2)
    assert got == expected, "rows come in the worker's seeded block order and in-block order, each once"
    assert got[:2000] != sorted(got[:2000])
    connection = ServiceConnection(ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs"))
    clients = WorkerClients(connection, snapshot.path, snapshot.metadata.run_id, ["id"])
    seed = splits.worker_seed(9, worker.target)
    sent = list(clients.stream_epoch(worker.target, seed, 0, 0, 2000, 64))
    assert [len(batch["id"]) for batch in sent] == [64] * 31 + [16], "cut where the consumer cuts its batches"
    assert np.concatenate([batch["id"] for batch in sent]).tolist() == expected[:2000]
    clients.close()


def test_streams_read_is_sent_only_after_the_last_partial_batch_was_handed_out(cluster, range_root):
    dispatcher, _ = cluster
    snapshot = reader.open_snapshot(range_root / "range10")
    connection = ServiceConnection(
        ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs", job_name="last-batch")
    )
    workers = WorkerClients(connection, snapshot.path, snapshot.metadata.run_id, ["id"])
    cursor = Cursor(0, new_consumer("last-batch"))
    request = JobRequest(
        job_name="last-batch",
        iteration=0,
        snapshot=snapshot.path,
        run_id=snapshot.metadata.run_id,
        processing_mode="parallel_epochs",
        consumer=cursor.consumer,
        seed=1,
    )
    batches = parallel_batches(
        connection, workers, snapshot.num_rows, request, cursor, DeliveryBatcher(3, drop_remainder=False)
    )

    def streams_read() -> bool:
        (job,) = [job for job in status(dispatcher.target)["jobs"] if job["job_name"] == "last-batch"]
        return job["consumers"][cursor.consumer]["streams_read"]

    sizes = [len(next(batches)["id"]) for _ in range(7)]
    assert sizes == [3] * 6 + [2], "20 rows (10 per worker) in batches of 3: the last one partial"
    assert not streams_read(), "every row was handed out, but the consumer has not asked for more yet"
    assert next(batches, None) is None
    assert streams_read()
    workers.close()


def test_a_dispatcher_gone_mid_epoch_is_logged_by_the_renewer_once_per_reason(cluster, uneven_snapshot, caplog):
    dispatcher, _ = cluster  # 2 s leases: renewed every 0.5 s
    caplog.set_level(logging.WARNING, logger="reader.service")
    dataset = reader.distributed_dataset(
        uneven_snapshot, 20, service=reader.ServiceOptions(address=dispatcher.target, timeout_seconds=3)
    )
    steps = iter(dataset)
    next(steps)
    dispatcher.stop()
    with pytest.raises(reader.ServiceUnavailableError):
        for _ in steps:
            pass
    renewals = [r for r in caplog.records if "cannot renew its leases" in r.getMessage()]
    assert renewals, "the renewer failed for 3 s without a word"
    assert all(r.levelno == logging.WARNING for r in renewals)
    messages = [r.getMessage() for r in renewals]
    assert len(messages) == len(set(messages)), f"one warning per reason, not one per renewal: {messages}"
    assert "UNAVAILABLE" in messages[-1]


def test_a_stream_ending_short_of_its_rows_is_an_error_not_fewer_rows(one_worker, range_root, monkeypatch):
    from reader.service import worker_streams

    dispatcher, _ = one_worker
    monkeypatch.setattr(worker_streams, "in_delivery_order", lambda *args: iter(()))
    dataset = reader.distributed_dataset(
        range_root / "range10",
        4,
        service=reader.ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs"),
    )
    with pytest.raises(reader.ServiceUnavailableError, match="ended 10 rows short"):
        list(dataset)
