import numpy as np
import pyarrow as pa
import pytest

from schemas import columns


def test_numpy_dict_round_trips_with_tensor_shapes():
    arrays = {
        "image": np.arange(2 * 3 * 3 * 2, dtype=np.uint8).reshape(2, 3, 3, 2),
        "label": np.array([1, 2], dtype=np.int64),
        "text": np.array([b"a", b"bc"], dtype=object),
    }
    batch = columns.record_batch_from_arrays(arrays)
    back = columns.batch_to_numpy(batch)
    np.testing.assert_array_equal(back["image"], arrays["image"])
    assert back["image"].shape == (2, 3, 3, 2)
    assert list(back["text"]) == [b"a", b"bc"]
    specs = {s.name: s for s in columns.column_specs(batch.schema)}
    assert list(specs["image"].shape) == [3, 3, 2] and specs["image"].dtype == "uint8" and specs["image"].is_tensor
    assert specs["text"].dtype == "binary"


def test_tensor_decode_is_zero_copy():
    batch = columns.record_batch_from_arrays({"x": np.ones((4, 8), dtype=np.float32)})
    decoded = columns.column_to_numpy(batch.column(0))
    assert not decoded.flags.owndata


def test_ragged_lengths_are_refused():
    with pytest.raises(ValueError, match="different numbers of rows"):
        columns.record_batch_from_arrays({"a": np.zeros(3), "b": np.zeros(4)})


def test_schema_difference_is_described():
    a = pa.schema([("id", pa.int64()), ("x", pa.float32())])
    b = pa.schema([("id", pa.float64()), ("y", pa.float32())])
    text = columns.describe_schema_difference(a, b)
    assert "column 'id' int64 -> double" in text and "missing columns ['x']" in text and "new columns ['y']" in text
