"""The device stage: steps made ahead on another thread, resumed at the consumer's position."""

import threading

import numpy as np
import pytest

import reader
from reader.dataset import DistributedDataset
from reader.outputs.device_prefetch import DevicePrefetcher


def ids_of(steps):
    return [step["id"].tolist() for step in steps]


class CountingTransfer:
    """A transfer that records how many steps it has made and on which thread."""

    def __init__(self):
        self.made = 0
        self.threads = set()

    def __call__(self, batches):
        self.made += 1
        self.threads.add(threading.current_thread().name)
        (batch,) = batches
        return {name: values.copy() for name, values in batch.items()}


def prefetched(path, depth, transfer, **kwargs):
    dataset = reader.distributed_dataset(path, 100, seed=3, columns=["id"], **kwargs)
    assert isinstance(dataset, DistributedDataset)
    return DevicePrefetcher(dataset.source.iterator(0, list), transfer, depth)


def test_prefetched_steps_are_the_reader_steps_made_on_another_thread(uneven_snapshot):
    expected = ids_of(reader.distributed_dataset(uneven_snapshot, 100, seed=3, columns=["id"]))
    transfer = CountingTransfer()
    assert ids_of(prefetched(uneven_snapshot, 2, transfer)) == expected
    assert transfer.made == len(expected) == 20
    assert transfer.threads == {"snapfeed-device-prefetch"}


def test_state_is_the_consumers_not_the_prefetchers(uneven_snapshot):
    """Steps held ahead on the device are read again after a restore, never skipped."""
    expected = ids_of(reader.distributed_dataset(uneven_snapshot, 100, seed=3, columns=["id"], num_epochs=2))
    transfer = CountingTransfer()
    steps = prefetched(uneven_snapshot, 3, transfer, num_epochs=2)
    head = [next(steps)["id"].tolist() for _ in range(7)]
    while transfer.made < 10:  # the stage has run ahead of the consumer
        threading.Event().wait(0.01)
    state = steps.get_state()
    assert (state["epoch"], state["step"]) == (0, 7)
    steps.close()
    restored = prefetched(uneven_snapshot, 3, CountingTransfer(), num_epochs=2)
    restored.set_state(state)
    assert head + ids_of(restored) == expected
    assert restored.get_state()["finished"]


def test_closing_and_iterating_again_resumes_where_the_consumer_was(uneven_snapshot):
    expected = ids_of(reader.distributed_dataset(uneven_snapshot, 100, seed=3, columns=["id"]))
    steps = prefetched(uneven_snapshot, 4, CountingTransfer())
    head = [next(steps)["id"].tolist() for _ in range(5)]
    steps.close()
    assert head + ids_of(steps) == expected


def test_a_transfer_error_reaches_the_consumer(uneven_snapshot):
    def failing(batches):
        raise RuntimeError("device out of memory")

    steps = prefetched(uneven_snapshot, 2, failing)
    with pytest.raises(RuntimeError, match="device out of memory"):
        next(steps)
    assert list(steps) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prefetch_to_device": -1}, "prefetch_to_device=-1; give a non-negative integer"),
        ({"prefetch_to_device": 2}, "prefetch_to_device=2 needs output='jax' or 'torch'"),
        ({"sharding": object()}, "sharding= places JAX arrays; it needs output='jax'"),
        ({"device": "cpu"}, "device= places torch tensors; it needs output='torch'"),
        ({"input_options": object()}, "input_options= .* applies with strategy="),
    ],
)
def test_placement_options_are_checked_before_reading(uneven_snapshot, kwargs, message):
    """A negative depth is refused as the group is made, the rest against the dataset's output and strategy."""
    with pytest.raises(reader.UsageError, match=message):
        reader.distributed_dataset(uneven_snapshot, 100, placement=reader.PlacementOptions(**kwargs))


def test_numpy_steps_are_unchanged_without_placement(uneven_snapshot):
    steps = list(reader.distributed_dataset(uneven_snapshot, 100, seed=3, columns=["id"]))
    assert all(isinstance(step["id"], np.ndarray) for step in steps)
