"""placement=PlacementOptions(device=...) with output='torch': tensors on the device, prefetched ahead, bad
devices refused before reading."""

import numpy as np
import pytest

import reader

torch = pytest.importorskip("torch")


def steps(path, **kwargs):
    return list(reader.distributed_dataset(path, 128, seed=6, columns=["id", "image", "payload"], **kwargs))


@pytest.mark.parametrize("prefetch_to_device", [0, 3])
def test_cpu_device_steps_equal_the_numpy_steps(uneven_snapshot, prefetch_to_device):
    expected = steps(uneven_snapshot, num_replicas=2)
    placement = reader.PlacementOptions(device="cpu", prefetch_to_device=prefetch_to_device)
    got = steps(uneven_snapshot, num_replicas=2, output="torch", placement=placement)
    assert len(got) == len(expected) == 16
    for ours, reference in zip(got, expected, strict=True):
        for replica_ours, replica_reference in zip(ours, reference, strict=True):
            assert replica_ours["image"].device == torch.device("cpu")
            np.testing.assert_array_equal(replica_ours["id"].numpy(), replica_reference["id"])
            np.testing.assert_array_equal(replica_ours["image"].numpy(), replica_reference["image"])
            assert isinstance(replica_ours["payload"], np.ndarray), "strings stay NumPy"
            assert replica_ours["payload"].tolist() == replica_reference["payload"].tolist()


def test_prefetched_cpu_steps_run_map_fn_and_resume(uneven_snapshot):
    def doubled_ids(batch):
        return batch["id"] * 2, batch["image"]

    def dataset():
        return reader.distributed_dataset(
            uneven_snapshot,
            100,
            seed=2,
            columns=["id", "image"],
            output="torch",
            map_fn=doubled_ids,
            num_epochs=2,
            placement=reader.PlacementOptions(device=torch.device("cpu"), prefetch_to_device=2),
        )

    everything = [ids.tolist() for ids, _ in dataset()]
    assert len(everything) == 40
    assert sorted(sum(everything[:20], [])) == list(range(0, 4000, 2))
    iterator = iter(dataset())
    head = [next(iterator)[0].tolist() for _ in range(5)]
    state = iterator.get_state()
    iterator.close()
    resumed = iter(dataset())
    resumed.set_state(state)
    assert head + [ids.tolist() for ids, _ in resumed] == everything


@pytest.mark.parametrize(
    "device, message",
    [
        ("gpu:0", r"device='gpu:0' is not a torch device .*; give e.g. 'cuda:0', 'cuda' or 'cpu'"),
        (3.5, r"device=3.5 is not a torch device"),
        ("meta", r"device='meta': the reader places tensors on 'cuda' or 'cpu' devices"),
    ],
)
def test_a_device_torch_cannot_parse_or_place_is_refused(uneven_snapshot, device, message):
    with pytest.raises(reader.UsageError, match=message):
        reader.distributed_dataset(
            uneven_snapshot, 100, output="torch", placement=reader.PlacementOptions(device=device)
        )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_cuda_device_is_refused_before_reading(uneven_snapshot):
    with pytest.raises(reader.UsageError) as raised:
        reader.distributed_dataset(
            uneven_snapshot, 100, output="torch", placement=reader.PlacementOptions(device="cuda:0")
        )
    assert str(raised.value).startswith(
        "device='cuda:0' but this machine has no CUDA device (torch.cuda.is_available() is False); "
    )


def test_a_cuda_index_beyond_the_devices_is_refused(uneven_snapshot, monkeypatch):
    """With one CUDA device (as torch would report on a one-GPU machine), cuda:1 does not exist."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(
        reader.UsageError, match=r"device='cuda:1' but this machine has 1 CUDA device\(s\), cuda:0 to cuda:0"
    ):
        reader.distributed_dataset(
            uneven_snapshot, 100, output="torch", placement=reader.PlacementOptions(device="cuda:1")
        )


def test_to_torch_refuses_device_placement(uneven_snapshot):
    dataset = reader.distributed_dataset(
        uneven_snapshot, 100, output="torch", placement=reader.PlacementOptions(device="cpu", prefetch_to_device=2)
    )
    with pytest.raises(reader.UsageError, match=r"to_torch\(\) feeds a DataLoader, whose workers cannot place"):
        dataset.to_torch()
