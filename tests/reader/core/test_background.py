"""Producer threads: a consumer never waits on a producer that is gone, and a dropped consumer's thread ends."""

import gc
import os
import signal
import threading
import time

import pytest

import reader
from reader.core.background import BackgroundProducer, ProducedIterator
from schemas.errors import SnapfeedError
from tests import helpers

#: Longer than any hand-over here takes: a call still waiting after it waits forever.
PATIENCE_SECONDS = 20


def within(call, seconds: float = PATIENCE_SECONDS):
    """``call()``'s result or exception, on a thread of its own; the test fails if it is still waiting after
    ``seconds`` (a wait forever would otherwise hang the test run)."""
    outcome = {}

    def run():
        try:
            outcome["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s: the consumer waits on a producer that is gone"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


class Numbers(ProducedIterator):
    """The smallest produced iterator: ``produce()`` on a producer thread."""

    def __init__(self, produce, producer_class=BackgroundProducer) -> None:
        self._produce = produce
        self._producer_class = producer_class

    def _new_producer(self):
        return self._producer_class(self._produce, 2, "test-producer")

    def _received(self, item):
        return item


def test_a_producer_whose_setup_fails_hands_its_error_to_the_consumer():
    def produce():
        raise OSError("the shard could not be opened")

    with pytest.raises(OSError, match="could not be opened"):
        within(lambda: next(Numbers(produce)))


class EndsWithoutAWord(BackgroundProducer):
    """A producer thread that ends without putting its items, its end marker or an error."""

    def run(self) -> None:
        return


def test_a_producer_thread_that_ended_without_its_end_marker_is_an_error_not_a_wait():
    iterator = Numbers(lambda: iter(range(3)), EndsWithoutAWord)
    with pytest.raises(SnapfeedError, match="test-producer thread ended without handing over its next item"):
        within(lambda: next(iterator))


def test_a_producer_that_never_started_is_an_error_not_a_wait():
    producer = BackgroundProducer(lambda: iter(range(3)), 2, "never-started")
    error = within(producer.next_item)
    assert isinstance(error, SnapfeedError) and "never started" in str(error)


def test_items_put_just_before_the_thread_ended_are_still_received():
    assert within(lambda: list(Numbers(lambda: iter(range(50))))) == list(range(50))


def test_device_prefetch_whose_thread_dies_is_an_error_not_a_wait(uneven_snapshot, monkeypatch):
    pytest.importorskip("torch")
    dataset = reader.distributed_dataset(
        uneven_snapshot,
        100,
        seed=3,
        output="torch",
        placement=reader.PlacementOptions(device="cpu", prefetch_to_device=2),
    )
    iterator = iter(dataset)
    next(iterator)
    iterator.close()  # the next ``next`` starts new producers, which this one drops every item of
    monkeypatch.setattr(BackgroundProducer, "_put", lambda self, item: False)
    with pytest.raises(SnapfeedError, match="thread ended without handing over its next item"):
        within(lambda: next(iterator))


def named_threads(prefix: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(prefix)]


def wait_until(condition, seconds: float = PATIENCE_SECONDS) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("prefetch_to_device", [0, 2])
def test_a_dropped_iterator_is_collected_and_its_producer_threads_end(uneven_snapshot, prefetch_to_device):
    if prefetch_to_device:
        pytest.importorskip("torch")
    placement = reader.PlacementOptions(device="cpu", prefetch_to_device=prefetch_to_device)
    kwargs = {"output": "torch", "placement": placement} if prefetch_to_device else {}
    dataset = reader.distributed_dataset(uneven_snapshot, 10, seed=3, num_epochs=None, **kwargs)
    assert wait_until(lambda: not named_threads("snapfeed-prefetch") and not named_threads("snapfeed-device"))
    iterators = [iter(dataset) for _ in range(5)]
    for iterator in iterators:
        next(iterator)
    assert len(named_threads("snapfeed-prefetch")) == 5
    del iterators, iterator
    gc.collect()
    assert wait_until(lambda: not named_threads("snapfeed-prefetch") and not named_threads("snapfeed-device")), [
        thread.name for thread in threading.enumerate()
    ]


def test_a_dropped_iterator_closes_its_shards_after_its_threads_end(tmp_path):
    """A snapshot of its own: nothing else in the process has its shards open."""
    snapshot = helpers.write_snapshot(tmp_path, "own", helpers.id_batches([300, 300]), shard_size_bytes=10_000)
    dataset = reader.distributed_dataset(snapshot, 10, seed=3, num_epochs=None)

    def open_shards() -> int:
        return sum(1 for name in os.listdir("/proc/self/fd") if snapshot in _target(name))

    iterator = iter(dataset)
    next(iterator)
    assert open_shards() > 0
    del iterator, dataset
    gc.collect()
    assert wait_until(lambda: open_shards() == 0), "the dropped iterator's pipeline still holds its shards open"


def _target(descriptor: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{descriptor}")
    except OSError:
        return ""


def test_a_loader_worker_killed_mid_epoch_is_an_error_not_a_wait(uneven_snapshot):
    torch = pytest.importorskip("torch")
    dataset = reader.distributed_dataset(uneven_snapshot, 10, seed=3, output="torch", num_epochs=None).to_torch()
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, timeout=0)
    steps = iter(loader)
    next(steps)
    os.kill(steps._workers[0].pid, signal.SIGKILL)

    def read_on():
        for _ in range(10_000):
            next(steps)

    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid \d+\) is killed by signal"):
        within(read_on, 60)
