"""An in-process reader service on loopback (port 0) for the service tests."""

import grpc
import pytest

from reader.service import DispatcherConfig, DispatchServer
from reader.service.rpc import DispatcherStub
from tests.reader.service.probes import with_two_workers


@pytest.fixture
def cluster():
    """A dispatcher with short leases (2 s) and two workers."""
    dispatcher = DispatchServer(DispatcherConfig(lease_seconds=2)).start()
    with with_two_workers(dispatcher) as workers:
        yield dispatcher, workers


@pytest.fixture
def journaled(tmp_path):
    """``start(name)``: a dispatcher journaling to ``tmp_path/name``, and a stub to it; all stopped after."""
    started = []

    def start(name: str):
        dispatcher = DispatchServer(DispatcherConfig(work_dir=str(tmp_path / name))).start()
        channel = grpc.insecure_channel(dispatcher.target.removeprefix("grpc://"))
        started.append((dispatcher, channel))
        return DispatcherStub(channel), str(tmp_path / name)

    yield start
    for dispatcher, channel in started:
        channel.close()
        dispatcher.stop()
