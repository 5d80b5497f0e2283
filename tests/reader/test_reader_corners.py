"""Reader corners: damaged shards of any codec, a column named by a string, batches larger than the data."""

import pathlib

import numpy as np
import pytest

import reader
from tests import helpers


@pytest.mark.parametrize("codec", ["NONE", "LZ4"])
@pytest.mark.parametrize("damage", ["header", "footer"])
def test_a_damaged_shard_is_the_same_error_naming_it_for_every_codec(tmp_path, codec, damage):
    path = helpers.write_snapshot(
        tmp_path, "s", [{"id": np.arange(2000), "x": np.arange(2000) * 0.5}], compression=codec
    )
    shard = next(pathlib.Path(path).glob("*/*.arrow"))
    data = bytearray(shard.read_bytes())
    span = range(8, 300) if damage == "header" else range(len(data) - 200, len(data) - 20)
    for i in span:
        data[i] ^= 0x5A  # same size: only a checksum would notice, and ReadOptions.verify_checksums is off by default
    shard.write_bytes(bytes(data))
    with pytest.raises(reader.CorruptSnapshotError) as error:
        list(reader.distributed_dataset(path, 100, seed=1))
    message = str(error.value)
    assert str(shard) in message and "snapfeed verify" in message
    assert "\n" not in message and "  " not in message, "one line, no padding"


def test_a_string_is_one_column(range_root):
    step = next(iter(reader.distributed_dataset(range_root / "range6", 6, columns="id", shuffle=False)))
    assert list(step) == ["id"] and step["id"].tolist() == list(range(6))


def test_a_batch_larger_than_the_data_with_drop_remainder_warns(range_root):
    with pytest.warns(UserWarning, match=r"global_batch_size=7 with drop_remainder=True leaves 0 steps.*6 rows"):
        dataset = reader.distributed_dataset(range_root / "range6", 7, drop_remainder=True)
    assert dataset.steps_per_epoch == 0 and list(dataset) == []


def test_a_batch_that_fits_does_not_warn(range_root, recwarn):
    reader.distributed_dataset(range_root / "range6", 6, drop_remainder=True)
    assert not [w for w in recwarn if "drop_remainder" in str(w.message)]
