"""The lease heartbeat of a consumer process: one thread per connection renews each reading consumer's leases."""

import threading
import time

import pytest

from reader.service import DispatcherConfig, DispatchServer
from reader.service.client.connection import ServiceConnection
from reader.service.options import ServiceOptions
from tests.reader.service.probes import job_request

LEASE_SECONDS = 0.6


@pytest.fixture
def dispatcher():
    server = DispatchServer(DispatcherConfig(lease_seconds=LEASE_SECONDS)).start()
    yield server
    server.stop()


def _renewers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "snapfeed-renew"]


def test_one_thread_renews_every_consumer_of_a_connection_until_each_lets_go(dispatcher, uneven_snapshot):
    connection = ServiceConnection(ServiceOptions(address=dispatcher.target, processing_mode="distributed_epoch"))
    stub = connection.dispatcher()
    held = {}
    for consumer in ("kept", "released"):
        job = stub.GetJob(job_request(uneven_snapshot, consumer, lease_index=0, lease_count=1), timeout=10)
        (leased,) = job.splits
        held[consumer] = leased.split
    before = len(_renewers())
    renewals = {consumer: connection.renewer().keep(job.job_id, consumer, LEASE_SECONDS) for consumer in held}
    assert len(_renewers()) == before + 1, "one thread for both consumers, started with the first"

    time.sleep(3 * LEASE_SECONDS)
    renewals["released"].release()
    time.sleep(2 * LEASE_SECONDS)

    taken = stub.GetJob(job_request(uneven_snapshot, "latecomer", lease_index=0, lease_count=10_000), timeout=10)
    leased_late = {leased.split for leased in taken.splits}
    assert held["released"] in leased_late, "the released consumer's lease lapsed and went to the latecomer"
    assert held["kept"] not in leased_late, "the kept consumer's lease was renewed for five terms"
    renewals["kept"].release()
    connection.renewer().stop()
    assert len(_renewers()) == before, "stopping the renewer (as the connection's finalizer does) ends its thread"
