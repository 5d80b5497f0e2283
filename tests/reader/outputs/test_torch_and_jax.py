"""PyTorch and JAX outputs carry the same rows as NumPy; the IterableDataset works with DataLoader."""

import numpy as np
import pytest

import reader

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")


def numpy_steps(path, **kwargs):
    return [step for step in reader.distributed_dataset(path, 128, seed=6, **kwargs)]


def test_torch_output_equals_numpy(uneven_snapshot):
    expected = numpy_steps(uneven_snapshot, columns=["id", "image", "value"])
    got = numpy_steps(uneven_snapshot, columns=["id", "image", "value"], output="torch")
    assert len(got) == len(expected)
    for ours, reference in zip(got, expected, strict=True):
        assert isinstance(ours["image"], torch.Tensor) and ours["image"].dtype == torch.uint8
        assert ours["image"].shape == reference["image"].shape
        for name in reference:
            np.testing.assert_array_equal(ours[name].numpy(), reference[name])


def test_jax_output_equals_numpy(uneven_snapshot):
    expected = numpy_steps(uneven_snapshot, num_replicas=2)
    got = numpy_steps(uneven_snapshot, num_replicas=2, output="jax")
    for ours, reference in zip(got, expected, strict=True):
        for replica_ours, replica_reference in zip(ours, reference, strict=True):
            assert isinstance(replica_ours["value"], jax.Array)
            np.testing.assert_array_equal(np.asarray(replica_ours["id"]), replica_reference["id"])
            np.testing.assert_array_equal(np.asarray(replica_ours["image"]), replica_reference["image"])
            assert replica_ours["payload"].tolist() == replica_reference["payload"].tolist()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iterable_dataset_with_dataloader_reads_every_row_once(uneven_snapshot, num_workers):
    dataset = reader.distributed_dataset(uneven_snapshot, 100, seed=1, columns=["id", "image"]).to_torch()
    # spawn: forking a process that runs JAX and TensorFlow threads can deadlock; this also shows the dataset pickles
    context = "spawn" if num_workers else None
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=num_workers, multiprocessing_context=context
    )
    orders = []
    for epoch in range(2):
        dataset.set_epoch(epoch)  # reaches the workers, which the loader re-creates every epoch
        batches = list(loader)
        ids = torch.cat([b["id"] for b in batches]).tolist()
        assert sorted(ids) == list(range(2000))
        assert all(b["image"].shape[1:] == (4, 4, 3) for b in batches)
        assert max(len(b["id"]) for b in batches) == 100
        orders.append(ids)
    assert orders[0] != orders[1], "every epoch is shuffled afresh"
    dataset.set_epoch(0)
    assert torch.cat([b["id"] for b in loader]).tolist() == orders[0], "the same epoch, the same order"
