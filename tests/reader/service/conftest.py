"""An in-process reader service on loopback (port 0) for the service tests."""

import pytest

from reader.service import DispatchServer, WorkerServer
from tests.reader.service.probes import wait_for_workers


@pytest.fixture
def cluster():
    """A dispatcher with short leases (2 s) and two workers."""
    dispatcher = DispatchServer(lease_seconds=2).start()
    workers = [WorkerServer(dispatcher.target).start() for _ in range(2)]
    wait_for_workers(dispatcher.target, 2)
    yield dispatcher, workers
    for worker in workers:
        worker.stop()
    dispatcher.stop()
