"""A GetJob that also leases (``lease_count``): the epoch's first round trip, with LeaseSplit's semantics."""

import grpc
import pytest

import reader
from reader.service.client.connection import ServiceConnection
from reader.service.dispatch_state import DispatchState, event_from_json
from schemas.service_pb2 import LeaseRequest
from tests.reader.service.probes import ids_of, job_request, journal


def _without_clock(events: list[dict]) -> list[dict]:
    """Events with their lease expiries left out (clock times)."""
    return [{k: v for k, v in event.items() if k != "expiry"} for event in events]


def _splits(reply) -> list[tuple[int, int, bool]]:
    return [(leased.split, leased.index, leased.taken_over) for leased in reply.splits]


def test_a_leasing_getjob_journals_and_answers_what_getjob_then_leasesplit_would(journaled, uneven_snapshot):
    one_stub, one_dir = journaled("one-round-trip")
    two_stub, two_dir = journaled("two-round-trips")

    leasing = one_stub.GetJob(job_request(uneven_snapshot, "c", lease_index=0, lease_count=3), timeout=10)
    job = two_stub.GetJob(job_request(uneven_snapshot, "c"), timeout=10)
    leased = two_stub.LeaseSplit(LeaseRequest(job_id=job.job_id, consumer="c", index=0, count=3), timeout=10)

    assert len(leasing.splits) == 3
    assert _splits(leasing) == _splits(leased)
    assert leasing.end_of_epoch == leased.end_of_epoch
    assert _without_clock(journal(one_dir)) == _without_clock(journal(two_dir))
    replayed = [
        DispatchState.replay(map(event_from_json, journal(work_dir)), now=0.0).jobs[1]
        for work_dir in (one_dir, two_dir)
    ]
    assert [(job.assignments, job.counts()) for job in replayed] == [
        ({"c": [leased.split for leased in leasing.splits]}, {"pending": job.num_splits - 3, "leased": 3, "done": 0})
    ] * 2


def test_a_leasing_getjob_rereads_a_consumers_assignments_by_index(journaled, uneven_snapshot):
    stub, _ = journaled("restore")
    first = stub.GetJob(job_request(uneven_snapshot, "c", lease_index=0, lease_count=2), timeout=10)
    again = stub.GetJob(job_request(uneven_snapshot, "c", lease_index=0, lease_count=3), timeout=10)
    other = stub.GetJob(job_request(uneven_snapshot, "d", lease_index=0, lease_count=1), timeout=10)

    assert _splits(again)[:2] == _splits(first), "a restored consumer gets the splits it was assigned, in order"
    assert again.splits[2].split not in {leased.split for leased in first.splits}
    assert other.splits[0].split not in {leased.split for leased in again.splits}
    with pytest.raises(grpc.RpcError) as refused:
        stub.GetJob(job_request(uneven_snapshot, "d", lease_index=5, lease_count=1), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_parallel_epochs_getjob_leases_nothing(journaled, uneven_snapshot):
    stub, work_dir = journaled("parallel")
    reply = stub.GetJob(job_request(uneven_snapshot, "c", "parallel_epochs", lease_count=4), timeout=10)
    assert not reply.splits and not reply.end_of_epoch
    assert [event["event"] for event in journal(work_dir)] == ["job", "consumer"]


@pytest.mark.parametrize("mode", ["distributed_epoch", "parallel_epochs"])
def test_epochs_of_a_dataset_share_one_dispatcher_channel_and_one_connection_per_worker(
    cluster, uneven_snapshot, monkeypatch, mode
):
    dispatcher, workers = cluster
    opened = []
    open_channel, open_flight = ServiceConnection.channel, ServiceConnection.flight_client
    monkeypatch.setattr(ServiceConnection, "channel", lambda self: opened.append("dispatcher") or open_channel(self))
    monkeypatch.setattr(
        ServiceConnection, "flight_client", lambda self, worker: opened.append(worker) or open_flight(self, worker)
    )
    dataset = reader.distributed_dataset(
        uneven_snapshot,
        64,
        num_epochs=3,
        service=reader.ServiceOptions(address=dispatcher.target, processing_mode=mode),
    )
    per_epoch = len(workers) if mode == "parallel_epochs" else 1
    assert ids_of(dataset) == {i: 3 * per_epoch for i in range(2000)}
    assert ids_of(dataset) == {i: 3 * per_epoch for i in range(2000)}, "a second iteration: three more epochs"
    assert sorted(opened) == sorted(["dispatcher", *(worker.target for worker in workers)])
