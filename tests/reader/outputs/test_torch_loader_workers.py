"""Epochs and collate_fn through DataLoader workers of to_torch() (real loader processes, spawned)."""

import pytest

import reader

torch = pytest.importorskip("torch")
shared_steps = pytest.importorskip("reader.outputs.shared_steps")


def ids_of(loader):
    return [int(i) for step in loader for i in step["id"]]


def loader_of(dataset, **options):
    # spawn: forking a process that runs JAX and TensorFlow threads can deadlock
    return torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=1, multiprocessing_context="spawn", **options
    )


def test_persistent_workers_shuffle_every_epoch_afresh_and_follow_set_epoch(uneven_snapshot):
    dataset = reader.distributed_dataset(uneven_snapshot, 100, seed=2, columns=["id", "image"]).to_torch()
    loader = loader_of(dataset, persistent_workers=True)
    first, second = ids_of(loader), ids_of(loader)  # no set_epoch: the worker advances its own epoch
    assert sorted(first) == sorted(second) == list(range(2000)), "every row once per epoch"
    assert first != second, "a fresh shuffle each epoch"
    dataset.set_epoch(5)  # the worker started at epoch 0 and would read epoch 2 next
    in_process = reader.distributed_dataset(uneven_snapshot, 100, seed=2, columns=["id", "image"]).to_torch()
    in_process.set_epoch(5)
    assert ids_of(loader) == ids_of(in_process), "set_epoch reaches a worker started before it"
    assert ids_of(loader) == ids_of(in_process), "and the worker goes on from there"


def step_ids(step):
    return step["id"]


def test_a_collate_fn_given_the_workers_steps_is_refused_with_one_clear_error(uneven_snapshot):
    if not shared_steps.WorkerRing.available():
        pytest.skip("steps cross in shared-memory slots only on Linux")
    dataset = reader.distributed_dataset(uneven_snapshot, 100, seed=2, columns=["id"]).to_torch()
    with pytest.raises(TypeError, match="leave collate_fn out"):
        next(iter(loader_of(dataset, collate_fn=step_ids)))


def test_rows_gathered_straight_into_the_workers_slots_arrive_intact(wide_snapshot):
    dataset = reader.distributed_dataset(wide_snapshot, 32, seed=3).to_torch()
    ids = []
    for step in loader_of(dataset, persistent_workers=True):
        width = step["payload"].shape[1]
        expected = (step["id"][:, None] * 7 + torch.arange(width)[None, :]) % 251
        assert torch.equal(step["payload"], expected.to(torch.uint8)), "each row's bytes in its row's place"
        ids += step["id"].tolist()
    assert sorted(ids) == list(range(len(ids))) and len(ids) in (160, 800)


def test_set_epoch_in_a_process_that_got_the_dataset_otherwise_stays_in_that_process(uneven_snapshot):
    dataset = reader.distributed_dataset(uneven_snapshot, 100, seed=2, columns=["id"]).to_torch()
    inherited = dataset._epoch_request
    inherited.owner = -1  # as in a DDP rank started with the dataset: its epochs are its own
    dataset.set_epoch(3)
    assert inherited.take() is None, "the process that made the dataset (and its workers) do not see it"
    in_process = reader.distributed_dataset(uneven_snapshot, 100, seed=2, columns=["id"]).to_torch()
    in_process.set_epoch(3)
    assert ids_of(dataset) == ids_of(in_process)
