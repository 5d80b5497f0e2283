"""DataLoader workers hand steps over in reused shared-memory slots (reader.outputs.shared_steps)."""

import collections
import os
import pickle

import numpy as np
import pytest

import reader
from reader.core.options import AUTO_PREFETCH_STEPS

torch = pytest.importorskip("torch")
shared_steps = pytest.importorskip("reader.outputs.shared_steps")

pytestmark = pytest.mark.skipif(not shared_steps.WorkerRing.available(), reason="needs /dev/shm (Linux)")

Pair = collections.namedtuple("Pair", "features label")


def step(start):
    return {
        "image": torch.arange(start, start + 96, dtype=torch.uint8).reshape(8, 4, 3),
        "value": torch.linspace(0, 1, 8, dtype=torch.float64) + start,
        "payload": np.array([b"x" * n for n in range(8)], dtype=object),
    }


def through_queue(shared):
    return pickle.loads(pickle.dumps(shared))


def test_a_step_crosses_in_a_slot_that_is_reused_once_freed():
    ring = shared_steps.WorkerRing()
    received = through_queue(ring.share(step(0)))
    torch.testing.assert_close(received["image"], step(0)["image"])
    torch.testing.assert_close(received["value"], step(0)["value"])
    assert received["payload"].tolist() == step(0)["payload"].tolist(), "object columns are pickled as they are"
    name = next(name for name in shared_steps._mapped if name.startswith(f"snapfeed_{os.getpid()}_"))
    assert not os.path.exists(f"/dev/shm/{name}"), "the training process removes the name once mapped"
    first_address = received["image"].data_ptr()
    del received
    again = through_queue(ring.share(step(7)))
    assert again["image"].data_ptr() == first_address, "the freed slot holds the next step"
    torch.testing.assert_close(again["image"], step(7)["image"])


def test_steps_go_torch_s_way_when_every_slot_is_held_or_they_do_not_fit():
    ring = shared_steps.WorkerRing()
    held = [through_queue(ring.share(step(k))) for k in range(shared_steps.SLOTS)]
    assert len({received["image"].data_ptr() for received in held}) == shared_steps.SLOTS
    extra = ring.share(step(50))
    assert isinstance(extra, dict), "no free slot: the step itself"
    bigger = {"image": torch.zeros(100, 4, 3, dtype=torch.uint8)}
    del held
    assert isinstance(ring.share(bigger), dict), "larger than a slot: the step itself"
    assert not isinstance(ring.share(step(1)), dict), "slots freed: shared again"


def pair(batch):
    return Pair(batch["image"], batch["id"])


def test_loader_workers_deliver_every_row_once_through_the_slots(uneven_snapshot):
    dataset = reader.distributed_dataset(uneven_snapshot, 100, seed=4, columns=["id", "image"], map_fn=pair)
    # spawn: forking a process that runs JAX and TensorFlow threads can deadlock
    loader = torch.utils.data.DataLoader(
        dataset.to_torch(), batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context="spawn"
    )
    for epoch in range(2):
        loader.dataset.set_epoch(epoch)
        ids, addresses = [], set()
        for batch in loader:
            assert isinstance(batch, Pair) and batch.features.shape[1:] == (4, 4, 3)
            label = batch.label
            ids += label.tolist()
            addresses.add(label.data_ptr())
        assert sorted(ids) == list(range(2000))
        assert len(addresses) <= 2 * shared_steps.slots_for(AUTO_PREFETCH_STEPS), "each worker's steps reuse its slots"


EMPTY_BATCH = {
    "image": np.empty((0, 4, 3), np.uint8),
    "value": np.empty((0,), np.float64),
    "payload": np.empty((0,), object),
}


def as_step(batch):
    """What the torch adapter makes of a gathered batch: tensors sharing its memory, object columns as they are."""
    return {name: values if values.dtype == object else torch.from_numpy(values) for name, values in batch.items()}


def made_ring(slots):
    """A ring made (and sized for a batch of 8 rows) by the first step it shares, as in a loader worker."""
    ring = shared_steps.WorkerRing(slots)
    through_queue(ring.share(as_step(ring.allocate(8, EMPTY_BATCH))))
    return ring


def test_a_batch_gathered_in_a_lent_slot_crosses_without_a_copy():
    ring = made_ring(2)
    batch = ring.allocate(8, EMPTY_BATCH)
    batch["image"][...] = 3
    batch["value"][...] = np.arange(8)
    batch["payload"][...] = [b"p"] * 8
    received = through_queue(ring.share(as_step(batch)))
    batch["image"][0, 0, 0] = 99  # the worker's array and the training process's tensor are the same memory
    assert received["image"][0, 0, 0].item() == 99, "handed over as gathered, not copied"
    torch.testing.assert_close(received["value"], torch.arange(8, dtype=torch.float64))
    assert received["payload"].tolist() == [b"p"] * 8, "object columns stay outside the slot"
    address = batch["image"].ctypes.data
    del batch, received
    assert ring.allocate(8, EMPTY_BATCH)["image"].ctypes.data == address, "freed by the training process: lent again"


def test_a_lent_slot_is_free_again_once_its_batch_is_dropped_in_the_worker():
    ring = made_ring(2)
    kept, dropped = ring.allocate(8, EMPTY_BATCH), ring.allocate(8, EMPTY_BATCH)
    address = dropped["image"].ctypes.data
    overflow = ring.allocate(8, EMPTY_BATCH)
    assert isinstance(ring.share(as_step(overflow)), dict), "no slot free: fresh arrays, then torch's way"
    del dropped  # e.g. map_fn replaced every array of the step
    assert ring.allocate(8, EMPTY_BATCH)["image"].ctypes.data == address
    assert kept["image"].ctypes.data != address


def test_a_step_map_fn_made_anew_is_copied_into_a_free_slot():
    ring = made_ring(3)
    batch = ring.allocate(8, EMPTY_BATCH)
    batch["image"][...] = 5
    mapped = {"image": torch.from_numpy(batch["image"]) + 1, "value": torch.from_numpy(batch["value"])}
    received = through_queue(ring.share(mapped))
    batch["image"][...] = 0
    assert received["image"].unique().tolist() == [6], "a copy: the worker's later writes do not reach it"
    torch.testing.assert_close(received["value"], torch.from_numpy(batch["value"]))


def test_a_collate_fn_reading_a_slot_handle_gets_one_clear_error():
    handle = shared_steps.WorkerRing().share(step(0))
    for read in (lambda: handle["image"], lambda: list(handle), lambda: handle.features):
        with pytest.raises((TypeError, AttributeError), match="leave collate_fn out .* map_fn="):
            read()
