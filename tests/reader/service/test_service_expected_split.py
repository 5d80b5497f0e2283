"""A warm distributed_epoch opens the split it expects to lease first before asking for its job (``FirstLease``)."""

import collections
import json
import threading

import pyarrow.flight as flight
import pytest

import reader
from reader.plan import all_blocks
from reader.service import splits
from reader.service.connection import ServiceConnection
from reader.service.read_ahead import open_expected
from reader.service.worker_clients import Cut, SplitRead, WorkerClients
from schemas.service_pb2 import JobRequest
from tests.reader.service.probes import ids_of


class _Calls:
    """What a consumer process asks, in order: leasing job requests ("job", epoch) and split streams opened
    ("split", epoch, split, worker)."""

    def __init__(self, monkeypatch) -> None:
        self.events: list[tuple] = []
        self._lock = threading.Lock()
        call, client = ServiceConnection.call, WorkerClients._client
        calls = self

        def recorded_call(connection, method, request):
            if isinstance(request, JobRequest) and request.lease_count:
                calls._add(("job", request.iteration))
            return call(connection, method, request)

        class _Recorded:
            def __init__(self, worker: str, client: flight.FlightClient) -> None:
                self._worker, self._client = worker, client

            def do_get(self, ticket, options):
                fields = json.loads(ticket.ticket)
                calls._add(("split", fields["iteration"], fields["split"], self._worker))
                return self._client.do_get(ticket, options)

        monkeypatch.setattr(ServiceConnection, "call", recorded_call)
        monkeypatch.setattr(WorkerClients, "_client", lambda self, worker: _Recorded(worker, client(self, worker)))

    def _add(self, event: tuple) -> None:
        with self._lock:
            self.events.append(event)

    def of_epoch(self, epoch: int) -> list[tuple]:
        return [event for event in self.events if event[1] == epoch]


def test_a_warm_epoch_opens_its_first_split_before_its_job_request_and_delivers_it_once(
    cluster, uneven_snapshot, monkeypatch
):
    dispatcher, _ = cluster
    calls = _Calls(monkeypatch)
    dataset = reader.distributed_dataset(uneven_snapshot, 64, service=dispatcher.target, seed=5, num_epochs=1)
    epochs = [ids_of(dataset) for _ in range(3)]  # each ``for`` over the dataset is the next epoch

    assert epochs == [{i: 1 for i in range(2000)}] * 3
    count = splits.split_count(all_blocks(reader.open_snapshot(uneven_snapshot).block_rows))
    cold = calls.of_epoch(0)
    assert cold[0] == ("job", 0), "nothing to expect before the first epoch"
    assert sorted(event[2] for event in cold[1:]) == list(range(count))
    first_split = cold[1][2]
    for epoch in (1, 2):
        warm = calls.of_epoch(epoch)
        assert warm[0][:3] == ("split", epoch, first_split), "the first split is asked for before the job"
        assert warm[1] == ("job", epoch)
        assert sorted(event[2] for event in warm if event[0] == "split") == list(range(count)), (
            "the split opened early is the one leased: no split asked for twice"
        )


def test_an_expected_split_another_consumer_leased_is_cancelled_not_delivered(cluster, uneven_snapshot, monkeypatch):
    dispatcher, _ = cluster
    calls = _Calls(monkeypatch)

    def shared(epochs: int):
        return reader.distributed_dataset(
            uneven_snapshot, 64, service=dispatcher.target, seed=5, job_name="shared", num_epochs=epochs
        )

    alone = shared(1)
    assert ids_of(alone) == {i: 1 for i in range(2000)}, "epoch 0, read alone: its first split is 0"
    other_started, other_ids = threading.Event(), []

    def other_consumer() -> None:  # joins at epoch 0 (over), then leases epoch 1's first splits before `alone`
        steps = iter(shared(2))
        first = next(steps)
        other_ids.extend(first["id"].tolist())
        other_started.set()
        other_ids.extend(i for step in steps for i in step["id"].tolist())

    other = threading.Thread(target=other_consumer)
    other.start()
    assert other_started.wait(30)
    read: dict = {}
    reading = threading.Thread(target=lambda: read.update(ids=ids_of(alone)), daemon=True)
    reading.start()
    reading.join(60)
    assert not reading.is_alive(), "epoch 1 never ended (a split delivered from the wrong stream leaves it waiting)"
    second_epoch = read["ids"]
    other.join(60)

    assert not other.is_alive()
    assert second_epoch + collections.Counter(other_ids) == {i: 1 for i in range(2000)}, "epoch 1: each row once"
    assert second_epoch, "the first consumer read splits of its own in epoch 1"
    opened_early = [event for event in calls.of_epoch(1) if event[:3] == ("split", 1, 0)]
    assert len(opened_early) == 2, "split 0: opened early by the first consumer, then read by the one it was leased to"
    assert ids_of(alone) == {i: 1 for i in range(2000)}, "epoch 2, alone again"
    assert calls.of_epoch(2)[0] == ("job", 2), "a consumer whose guess missed skips one guess"
    assert ids_of(alone) == {i: 1 for i in range(2000)}
    assert [event[0] for event in calls.of_epoch(3)[:2]] == ["split", "job"], "and guesses again after"


def test_an_expected_split_whose_worker_stopped_is_given_up_at_once(cluster, uneven_snapshot, monkeypatch):
    dispatcher, workers = cluster
    calls = _Calls(monkeypatch)
    dataset = reader.distributed_dataset(uneven_snapshot, 64, service=dispatcher.target, seed=5, num_epochs=1)
    assert ids_of(dataset) == {i: 1 for i in range(2000)}
    first_worker = calls.of_epoch(0)[1][3]
    next(worker for worker in workers if worker.target == first_worker).stop()

    assert ids_of(dataset) == {i: 1 for i in range(2000)}
    warm = calls.of_epoch(1)
    assert warm[0][0] == "split" and warm[0][3] == first_worker, "asked of the worker that served it last epoch"
    assert warm[1] == ("job", 1), "and given up at once: the job request comes next"
    assert all(event[3] != first_worker for event in warm[2:])


@pytest.mark.timeout(60)  # given up at once: a retried one would wait service_timeout_seconds (an hour here)
@pytest.mark.parametrize("workers", [[], ["grpc://127.0.0.1:1"]], ids=["no-worker", "refused"])
def test_an_expected_split_nobody_answers_is_given_up_not_retried(uneven_snapshot, workers):
    snapshot = reader.open_snapshot(uneven_snapshot)
    connection = ServiceConnection("grpc://127.0.0.1:1", "distributed_epoch", None, timeout_seconds=3600)
    clients = WorkerClients(connection, snapshot.path, snapshot.metadata.run_id, ["id"])
    in_order = splits.job_blocks(all_blocks(snapshot.block_rows), 5, 1)
    read = SplitRead(workers, lambda: [], in_order, 5, 1, 0, 0, Cut(64), expected=True)
    assert open_expected(clients, read) is None
    clients.close()
