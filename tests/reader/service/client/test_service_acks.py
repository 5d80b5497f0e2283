"""Acks ride on lease requests: one round trip per lease, none per split, and none lost when a consumer stops."""

import collections
import gc
import json
import threading
import time

import pytest

import reader
from reader.service import DispatcherConfig, DispatchServer, splits
from reader.service.client.leases import LeaseClient
from reader.service.dispatcher import DispatchServicer
from schemas.service_pb2 import Empty, LeaseRequest
from tests.reader.service.probes import ids_of, job_request, journal, status, with_two_workers


def _consumer_counts(dispatcher) -> dict:
    (job,) = status(dispatcher.target)["jobs"]
    (counts,) = job["consumers"].values()
    return counts


def _status(stub) -> dict:
    return json.loads(stub.Status(Empty(), timeout=10).json)


def test_a_lease_request_acks_the_splits_it_carries_before_leasing(journaled, uneven_snapshot):
    stub, work_dir = journaled("acks")
    job = stub.GetJob(job_request(uneven_snapshot, "c", lease_index=0, lease_count=2), timeout=10)
    first, second = (leased.split for leased in job.splits)

    reply = stub.LeaseSplit(LeaseRequest(job_id=job.job_id, consumer="c", index=2, count=1, acked=[first]), timeout=10)

    assert not reply.ack_refused and len(reply.splits) == 1
    events = journal(work_dir)
    acked_at = next(i for i, e in enumerate(events) if e["event"] == "ack")
    assert events[acked_at]["split"] == first and events[acked_at]["consumer"] == "c"
    assert all(e["event"] != "ack" for e in events[acked_at + 1 :]), "one ack, journaled before the new lease"
    assert acked_at < len(events) - 1, "the lease that follows is journaled after the ack"
    counts = _status(stub)["jobs"][0]["consumers"]["c"]
    assert counts == {"assigned": 3, "leased": 2, "done": 1}
    assert second not in (leased.split for leased in reply.splits)


def test_an_ack_of_a_split_another_consumer_holds_is_refused_and_the_lease_still_made(journaled, uneven_snapshot):
    stub, _ = journaled("refused")
    job = stub.GetJob(job_request(uneven_snapshot, "c", lease_index=0, lease_count=1), timeout=10)
    theirs = stub.GetJob(job_request(uneven_snapshot, "d", lease_index=0, lease_count=1), timeout=10).splits[0].split

    reply = stub.LeaseSplit(LeaseRequest(job_id=job.job_id, consumer="c", index=1, count=1, acked=[theirs]), timeout=10)

    assert list(reply.ack_refused) == [theirs]
    assert len(reply.splits) == 1
    assert _status(stub)["jobs"][0]["consumers"]["d"] == {"assigned": 1, "leased": 1, "done": 0}


@pytest.fixture
def counted_cluster(monkeypatch):
    """A dispatcher whose AckSplit and LeaseSplit calls are counted (``calls``), and two workers."""
    calls = collections.Counter()
    for method in ("AckSplit", "LeaseSplit"):
        original = getattr(DispatchServicer, method)

        def counted(self, request, context, _original=original, _method=method):
            calls[_method] += 1
            return _original(self, request, context)

        monkeypatch.setattr(DispatchServicer, method, counted)
    dispatcher = DispatchServer(DispatcherConfig(lease_seconds=30)).start()
    with with_two_workers(dispatcher):
        yield dispatcher, calls


def test_an_epoch_acks_every_split_with_its_leases_and_no_ack_call(counted_cluster, uneven_snapshot):
    dispatcher, calls = counted_cluster
    dataset = reader.distributed_dataset(
        uneven_snapshot, 64, seed=3, service=reader.ServiceOptions(address=dispatcher.target, job_name="epoch")
    )

    counts = ids_of(dataset)

    assert sorted(counts) == list(range(2000)) and set(counts.values()) == {1}
    (job,) = status(dispatcher.target)["jobs"]
    assert job["splits"] == {"pending": 0, "leased": 0, "done": job["splits"]["done"]} and job["finished"]
    assert calls["AckSplit"] == 0, "every ack went with a lease request"
    assert 0 < calls["LeaseSplit"] < job["splits"]["done"], "fewer lease round trips than splits"


@pytest.mark.parametrize("stop", ["close", "drop"])
def test_a_consumer_that_stops_mid_epoch_acks_the_splits_it_delivered_whole(
    counted_cluster, large_snapshot, stop, monkeypatch
):
    """Blocks of 50 rows, batches of a split's rows: each batch is exactly one split. A consumer dropped
    unclosed (left in a reference cycle, so the collector finalizes it) acks them on the reaper thread,
    never inside the collector (where its generators' clean-up would run if nothing held them)."""
    dispatcher, _ = counted_cluster
    acked_on = []
    original = LeaseClient.ack_in_background

    def ack_in_background(self, split_ids):
        acked_on.append(threading.current_thread().name)
        return original(self, split_ids)

    monkeypatch.setattr(LeaseClient, "ack_in_background", ack_in_background)
    split_rows = 50 * splits.BLOCKS_PER_SPLIT
    dataset = reader.distributed_dataset(
        large_snapshot, split_rows, seed=3, service=reader.ServiceOptions(address=dispatcher.target, job_name="stops")
    )
    iterator = iter(dataset)
    delivered = [next(iterator) for _ in range(3)]

    if stop == "close":
        iterator.close()
    else:
        cycle = [iterator]
        cycle.append(cycle)
        del iterator, cycle
        gc.collect()

    assert [len(batch["id"]) for batch in delivered] == [split_rows] * 3
    deadline = time.monotonic() + 10
    while (counts := _consumer_counts(dispatcher))["done"] < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert counts["done"] == 3, "the splits delivered whole are acked, also the ones no lease request carried yet"
    assert acked_on == ["MainThread" if stop == "close" else "snapfeed-reaper"]
    assert counts["leased"] == counts["assigned"] - 3, "the splits read ahead stay leased until their leases lapse"
