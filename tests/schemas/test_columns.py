import numpy as np
import pyarrow as pa
import pytest

from schemas import columns
from schemas.errors import SchemaMismatchError


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


def test_every_batch_must_have_the_first_batchs_schema():
    first = pa.schema([("id", pa.int64())])
    assert columns.check_same_schema(None, first, "fn") is first
    assert columns.check_same_schema(first, pa.schema([("id", pa.int64())]), "fn") is first
    changed = pa.schema([("id", pa.float64())])
    with pytest.raises(
        SchemaMismatchError,
        match=r"^fn changed its output schema between batches \(column 'id' "
        r"int64 -> double\): in shard x\. Return the same columns",
    ):
        columns.check_same_schema(first, changed, "fn", ": in shard x")


def test_stored_column_keeps_readable_columns_as_they_are():
    column = pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32(), 2))
    assert columns.stored_column("x", column) is column
    assert columns.stored_column("s", pa.array(["a", None])).to_pylist() == ["a", None]


def test_stored_column_fills_missing_floats_and_lists():
    assert str(columns.stored_column("f", pa.array([1.0, None])).to_pylist()) == "[1.0, nan]"
    ragged = columns.stored_column("r", pa.array([[1], None, [2, 3]], pa.large_list(pa.int64())))
    assert ragged.to_pylist() == [[1], [], [2, 3]] and ragged.type == pa.large_list(pa.int64())


def test_a_tensor_with_a_missing_row_is_refused_naming_the_column():
    column = pa.array([[1.0, 2.0], None], pa.list_(pa.float64(), 2))
    with pytest.raises(
        SchemaMismatchError, match=r"column 'emb' \(fixed_size_list<item: double>\[2\]\) has 1 missing rows"
    ):
        columns.stored_column("emb", column)


def test_specs_of_fixed_and_variable_lists():
    schema = pa.schema(
        [
            ("grid", pa.list_(pa.list_(pa.int32(), 3), 2)),
            ("tokens", pa.large_list(pa.int64())),
            ("w", pa.list_(pa.string())),
        ]
    )
    specs = {s.name: (s.dtype, list(s.shape)) for s in columns.column_specs(schema)}
    assert specs == {
        "grid": ("int32", [2, 3]),
        "tokens": ("int64", [columns.VARIABLE]),
        "w": ("string", [columns.VARIABLE]),
    }


def test_numpy_to_record_batch_inverts_batch_to_numpy_for_every_stored_column_kind():
    batch = pa.RecordBatch.from_pydict(
        {
            "tensor": columns.record_batch_from_arrays({"t": np.arange(24, dtype=np.uint8).reshape(2, 3, 4)}).column(0),
            "nested": pa.array([[[1.0, 2.0]], [[3.0, 4.0]]], pa.list_(pa.list_(pa.float32(), 2), 1)),
            "label": pa.array([7, 8], pa.int32()),
            "flag": pa.array([True, False]),
            "text": pa.array(["a", None], pa.large_string()),
            "raw": pa.array([b"x", b"yz"]),
            "ragged": pa.array([[1, 2], []], pa.large_list(pa.int64())),
            "words": pa.array([["a"], ["b", "c"]], pa.list_(pa.string())),
        }
    )
    arrays = columns.batch_to_numpy(batch)
    rebuilt = columns.numpy_to_record_batch(batch.schema, arrays)
    assert rebuilt.equals(batch) and rebuilt.schema.equals(batch.schema, check_metadata=True)
    tensor = columns.numpy_to_record_batch(pa.schema([batch.schema.field("tensor")]), {"tensor": arrays["tensor"]})
    assert tensor.column(0).storage.values.buffers()[1].address == arrays["tensor"].ctypes.data, "zero-copy"
