"""A warm distributed_epoch opens the split it expects to lease first while its job request is answered (``FirstLease``)."""

import collections
import json
import threading

import pyarrow.flight as flight
import pytest

import reader
from reader.core.plan import all_blocks
from reader.service import splits
from reader.service.client.connection import ServiceConnection
from reader.service.client.read_ahead import open_expected
from reader.service.client.worker_clients import Cut, SplitRead, WorkerClients
from reader.service.options import ServiceOptions
from schemas.service_pb2 import JobRequest
from tests.reader.service.probes import ids_of

#: How long a held epoch's job request waits for its expected split to be opened, and that split for the request.
OVERLAP_WAIT_SECONDS = 5.0


class _Calls:
    """What a consumer process asks, in order: job requests ("job", epoch) as they are sent and ("answered",
    epoch) once answered, split streams opened ("split", epoch, split, worker) and parallel_epochs streams
    opened ("stream", epoch, worker).

    In a ``held`` epoch the job request is answered only once a split of that epoch was opened, and the
    epoch's first split is opened only once the job request was sent (each waits at most
    ``OVERLAP_WAIT_SECONDS``): ``overlapped[epoch]`` says whether both happened, i.e. the split was opened
    while the job request was in flight, whatever the threads' timing.
    """

    def __init__(self, monkeypatch, held: set[int] = frozenset()) -> None:
        self.events: list[tuple] = []
        self.overlapped: dict[int, bool] = {}
        self._held = held
        self._sent = collections.defaultdict(threading.Event)
        self._opened = collections.defaultdict(threading.Event)
        self._lock = threading.Lock()
        call, client = ServiceConnection.call, WorkerClients._client
        calls = self

        def recorded_call(connection, method, request):
            parallel = isinstance(request, JobRequest) and request.processing_mode == "parallel_epochs"
            if not (isinstance(request, JobRequest) and (request.lease_count or parallel)):
                return call(connection, method, request)
            epoch = request.iteration
            calls._add(("job", epoch))
            calls._sent[epoch].set()
            if epoch in calls._held:
                calls._opened[epoch].wait(OVERLAP_WAIT_SECONDS)
            reply = call(connection, method, request)
            calls._add(("answered", epoch))
            return reply

        class _Recorded:
            def __init__(self, worker: str, client: flight.FlightClient) -> None:
                self._worker, self._client = worker, client

            def do_get(self, ticket, options):
                fields = json.loads(ticket.ticket)
                epoch = fields["iteration"]
                if "split" in fields:
                    calls._add(("split", epoch, fields["split"], self._worker))
                else:  # parallel_epochs: the worker's whole epoch
                    calls._add(("stream", epoch, self._worker))
                if epoch in calls._held and not calls._opened[epoch].is_set():
                    calls._opened[epoch].set()
                    calls.overlapped[epoch] = calls._sent[epoch].wait(OVERLAP_WAIT_SECONDS)
                return self._client.do_get(ticket, options)

        monkeypatch.setattr(ServiceConnection, "call", recorded_call)
        monkeypatch.setattr(WorkerClients, "_client", lambda self, worker: _Recorded(worker, client(self, worker)))

    def _add(self, event: tuple) -> None:
        with self._lock:
            self.events.append(event)

    def of_epoch(self, epoch: int) -> list[tuple]:
        return [event for event in self.events if event[1] == epoch]

    def opened_before_answer(self, epoch: int) -> list[tuple]:
        """The streams of ``epoch`` opened before its job request was answered (the expected one, if any)."""
        events = self.of_epoch(epoch)
        return [event for event in events[: events.index(("answered", epoch))] if event[0] in ("split", "stream")]


def test_a_warm_epoch_opens_its_first_split_while_its_job_request_is_answered_and_delivers_it_once(
    cluster, uneven_snapshot, monkeypatch
):
    dispatcher, _ = cluster
    calls = _Calls(monkeypatch, held={1, 2})
    dataset = reader.distributed_dataset(uneven_snapshot, 64, service=dispatcher.target, seed=5, num_epochs=1)
    epochs = [ids_of(dataset) for _ in range(3)]  # each ``for`` over the dataset is the next epoch

    assert epochs == [{i: 1 for i in range(2000)}] * 3
    count = splits.split_count(all_blocks(reader.open_snapshot(uneven_snapshot).block_rows))
    cold = calls.of_epoch(0)
    assert cold[:2] == [("job", 0), ("answered", 0)], "nothing to expect before the first epoch"
    assert sorted(event[2] for event in cold if event[0] == "split") == list(range(count))
    first_split = cold[2][2]
    for epoch in (1, 2):
        assert calls.overlapped[epoch], "the job request is in flight while the expected split is opened"
        assert [event[2] for event in calls.opened_before_answer(epoch)] == [first_split]
        warm = calls.of_epoch(epoch)
        assert sorted(event[2] for event in warm if event[0] == "split") == list(range(count)), (
            "the split opened early is the one leased: no split asked for twice"
        )


def test_an_expected_split_another_consumer_leased_is_cancelled_not_delivered(cluster, uneven_snapshot, monkeypatch):
    dispatcher, _ = cluster
    calls = _Calls(monkeypatch, held={3})  # epoch 3's guess is opened before its answer, however threads run

    def shared(epochs: int):
        return reader.distributed_dataset(
            uneven_snapshot,
            64,
            seed=5,
            num_epochs=epochs,
            service=reader.ServiceOptions(address=dispatcher.target, job_name="shared"),
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
    assert calls.opened_before_answer(2) == [], "a consumer whose guess missed skips one guess"
    assert ids_of(alone) == {i: 1 for i in range(2000)}
    assert calls.overlapped[3] and len(calls.opened_before_answer(3)) == 1, "and guesses again after"


def test_an_expected_split_whose_worker_stopped_is_given_up_at_once(cluster, uneven_snapshot, monkeypatch):
    dispatcher, workers = cluster
    calls = _Calls(monkeypatch, held={1})
    dataset = reader.distributed_dataset(uneven_snapshot, 64, service=dispatcher.target, seed=5, num_epochs=1)
    assert ids_of(dataset) == {i: 1 for i in range(2000)}
    first_worker = calls.of_epoch(0)[2][3]
    next(worker for worker in workers if worker.target == first_worker).stop()

    assert ids_of(dataset) == {i: 1 for i in range(2000)}
    (expected,) = calls.opened_before_answer(1)
    assert expected[3] == first_worker, "asked of the worker that served it last epoch, and given up at once"
    later = [event for event in calls.of_epoch(1) if event[0] == "split"][1:]
    assert later and all(event[3] != first_worker for event in later)


@pytest.mark.timeout(60)  # given up at once: a retried one would wait timeout_seconds (an hour here)
@pytest.mark.parametrize("workers", [[], ["grpc://127.0.0.1:1"]], ids=["no-worker", "refused"])
def test_an_expected_split_nobody_answers_is_given_up_not_retried(uneven_snapshot, workers):
    snapshot = reader.open_snapshot(uneven_snapshot)
    connection = ServiceConnection(
        ServiceOptions(address="grpc://127.0.0.1:1", processing_mode="distributed_epoch", timeout_seconds=3600)
    )
    clients = WorkerClients(connection, snapshot.path, snapshot.metadata.run_id, ["id"])
    in_order = splits.job_blocks(all_blocks(snapshot.block_rows), 5, 1)
    read = SplitRead(workers, lambda: [], in_order, 5, 1, 0, 0, Cut(64), expected=True)
    assert open_expected(clients, read) is None
    clients.close()


def test_a_warm_parallel_epoch_opens_its_first_workers_stream_while_its_job_request_is_answered(
    cluster, uneven_snapshot, monkeypatch
):
    dispatcher, workers = cluster
    calls = _Calls(monkeypatch, held={1, 2})
    dataset = reader.distributed_dataset(
        uneven_snapshot,
        64,
        seed=5,
        num_epochs=1,
        service=reader.ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs"),
    )
    epochs = [ids_of(dataset) for _ in range(3)]

    assert epochs == [{i: len(workers) for i in range(2000)}] * 3, "every row once per worker, every epoch"
    cold = calls.of_epoch(0)
    assert cold[:2] == [("job", 0), ("answered", 0)], "nothing to expect before the first epoch"
    first_worker = cold[2][2]
    for epoch in (1, 2):
        assert calls.overlapped[epoch], "the job request is in flight while the first worker's stream is opened"
        assert calls.opened_before_answer(epoch) == [("stream", epoch, first_worker)]
        opened = sorted(event[2] for event in calls.of_epoch(epoch) if event[0] == "stream")
        assert opened == sorted(worker.target for worker in workers), "the stream opened early is the one read"


def test_a_first_workers_stream_is_read_only_for_the_same_seed_and_a_worker_the_job_still_has(cluster, uneven_snapshot):
    from reader.service.client.parallel_reads import FirstWorkerStream

    dispatcher, workers = cluster
    snapshot = reader.open_snapshot(uneven_snapshot)
    connection = ServiceConnection(ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs"))
    clients = WorkerClients(connection, snapshot.path, snapshot.metadata.run_id, ["id"])
    job = collections.namedtuple("Job", "seed workers")
    first, second = (worker.target for worker in workers)
    guess = FirstWorkerStream()
    guess.remember(job(7, [first, second]))

    opened = guess.open(clients, 1, 2000, 64)
    (stream,) = opened.streams_for(job(7, [second, first])).values()
    fresh = clients.stream_epoch(first, splits.worker_seed(7, first), 1, 0, 2000, 64)
    assert [b["id"].tolist() for b in stream] == [b["id"].tolist() for b in fresh], "the rows the job asks of it"

    opened = guess.open(clients, 1, 2000, 64)
    assert opened.streams_for(job(8, [first, second])) == {}, "another seed: other rows"
    assert next(opened.stream, None) is None, "and the stream is cancelled"
    opened = guess.open(clients, 1, 2000, 64)
    assert opened.streams_for(job(7, [second])) == {}, "a worker the job no longer has"
    guess.remember(job(7, []))
    assert guess.open(clients, 1, 2000, 64) is None, "no workers: nothing to guess"
    clients.close()
