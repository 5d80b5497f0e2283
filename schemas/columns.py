"""What a snapshot column can be: Arrow types as the job stores them and as readers get them.

One mapping for writer and reader, so whatever the job commits, every reader
output can read (docs/reading.md "Column types"):

- numbers and bools: NumPy arrays of that dtype. Missing floats are stored as
  NaN; missing ints and bools are refused (they have no missing value).
- strings and bytes: object arrays of ``str``/``bytes``; missing values are
  ``None`` (TensorFlow gets ``b""``, as ``tf.io.parse_example`` would).
- fixed-shape tensors, stored as Arrow's canonical ``arrow.fixed_shape_tensor``
  extension type (a fixed-size list whose shape travels in the schema), and
  plain (nested) fixed-size lists: one array of shape ``[rows, *shape]``;
  decoding is a zero-copy reshape.
- variable-length lists of numbers, bools, strings or bytes (TFRecord without
  ``--schema``): an object array holding one 1-D array per row (a
  ``tf.RaggedTensor`` for TensorFlow); a missing list is an empty one.

Everything else (structs, maps, nested variable-length lists, dates, times,
decimals, all-null columns) is refused when the job writes the first batch,
naming the column and what to do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.errors import SchemaMismatchError
from schemas.snapshot_pb2 import ColumnSpec

#: ``ColumnSpec.shape`` of a variable-length list column: one dimension of unknown size.
VARIABLE = -1
_FIX = "convert it in --preprocessing_fn (or give TFRecord input a --schema)"


def _column_to_arrow(name: str, values: np.ndarray) -> pa.Array:
    if values.dtype == object or values.dtype.kind in ("S", "U"):
        if values.ndim != 1:
            raise TypeError(f"column {name!r}: string/bytes columns must be 1-D, got shape {values.shape}")
        return pa.array(values.tolist())
    if values.ndim == 0:
        raise TypeError(f"column {name!r} is a scalar; give one value per row (shape [batch, ...])")
    if values.ndim == 1:
        return pa.array(values)
    row_shape = values.shape[1:]
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    storage = pa.FixedSizeListArray.from_arrays(flat, math.prod(row_shape))
    return pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(flat.type, list(row_shape)), storage)


def record_batch_from_arrays(arrays: Mapping[str, object]) -> pa.RecordBatch:
    """A RecordBatch from ``{name: array-like [batch, ...]}``; every column the same length."""
    columns = {name: np.asarray(values) for name, values in arrays.items()}
    lengths = {name: (len(values) if values.ndim else 0) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"columns have different numbers of rows: {lengths}")
    names = list(columns)
    return pa.RecordBatch.from_arrays([_column_to_arrow(n, columns[n]) for n in names], names=names)


def _is_number(value_type: pa.DataType) -> bool:
    return pa.types.is_integer(value_type) or pa.types.is_floating(value_type) or pa.types.is_boolean(value_type)


def _is_text(value_type: pa.DataType) -> bool:
    return any(
        check(value_type)
        for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
    )


def _is_variable_list(value_type: pa.DataType) -> bool:
    return pa.types.is_list(value_type) or pa.types.is_large_list(value_type)


def _refusal(name: str, column_type: pa.DataType, why: str, fix: str = _FIX) -> SchemaMismatchError:
    return SchemaMismatchError(f"column {name!r} ({column_type}) {why}; {fix}")


def _stored_numbers(name: str, values: pa.Array) -> pa.Array:
    """Numbers without nulls: missing floats become NaN, missing ints and bools are refused."""
    if not values.null_count:
        return values
    if pa.types.is_floating(values.type):
        return pc.fill_null(values, pa.scalar(math.nan, values.type))
    raise _refusal(
        name,
        values.type,
        f"has {values.null_count} missing values and ints and bools have no missing value",
        "fill them in --preprocessing_fn (pyarrow.compute.fill_null) or cast the column to float (missing -> NaN)",
    )


def _stored_fixed_list(name: str, column: pa.FixedSizeListArray, column_type: pa.DataType) -> pa.Array:
    if column.null_count:
        raise _refusal(name, column_type, f"has {column.null_count} missing rows, and a tensor has no missing value")
    values = column.flatten()
    if pa.types.is_fixed_size_list(values.type):
        stored = _stored_fixed_list(name, values, column_type)
    elif _is_number(values.type):
        stored = _stored_numbers(name, values)
    else:
        raise _refusal(name, column_type, "is a fixed-size list of neither numbers nor fixed-size lists")
    if stored is values and not column.offset:
        return column
    return pa.FixedSizeListArray.from_arrays(stored, column.type.list_size)


def _stored_variable_list(name: str, column: pa.Array) -> pa.Array:
    values = column.flatten()  # skips the values of missing lists
    if _is_number(values.type):
        stored = _stored_numbers(name, values)
    elif _is_text(values.type) and not values.null_count:
        stored = values
    else:
        why = "has missing strings inside its lists" if _is_text(values.type) else "is a list of lists or records"
        raise _refusal(name, column.type, f"{why}, which no reader output can represent")
    if stored is values and not column.null_count:
        return column
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
    offsets = pa.array(
        np.concatenate([[0], np.cumsum(lengths)]), pa.int64() if pa.types.is_large_list(column.type) else pa.int32()
    )
    return type(column).from_arrays(offsets, stored)


def stored_column(name: str, column: pa.Array) -> pa.Array:
    """The column as a snapshot stores it (see the module docstring), or why it cannot be stored.

    Pure and cheap on the common case (no nulls, no conversion): the column itself comes back.
    Raises ``SchemaMismatchError`` naming the column, its type and what to do.
    """
    column_type = column.type
    if pa.types.is_dictionary(column_type):
        return stored_column(name, column.dictionary_decode())
    if pa.types.is_fixed_size_binary(column_type):
        return column.cast(pa.binary())
    if isinstance(column_type, pa.FixedShapeTensorType):
        storage = _stored_fixed_list(name, column.storage, column_type)
        return column if storage is column.storage else pa.ExtensionArray.from_storage(column_type, storage)
    if _is_text(column_type):
        return column
    if _is_number(column_type):
        return _stored_numbers(name, column)
    if pa.types.is_fixed_size_list(column_type):
        return _stored_fixed_list(name, column, column_type)
    if _is_variable_list(column_type):
        return _stored_variable_list(name, column)
    if pa.types.is_null(column_type):
        raise _refusal(
            name,
            column_type,
            "holds no value in this batch (every value missing)",
            "drop it or cast it in --preprocessing_fn",
        )
    raise _refusal(
        name,
        column_type,
        "is not a type snapshots store (numbers, bools, strings, bytes, fixed-size or variable-length lists of them)",
        "cast it in --preprocessing_fn, e.g. timestamps/dates to int64, decimals to float64, "
        "struct fields to columns of their own",
    )


def stored_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` with every column as ``stored_column`` gives it (the batch itself when none changed)."""
    stored = [stored_column(name, column) for name, column in zip(batch.schema.names, batch.columns, strict=True)]
    if all(new is old for new, old in zip(stored, batch.columns, strict=True)):
        return batch
    return pa.RecordBatch.from_arrays(stored, names=batch.schema.names)


def _fixed_shape(column_type: pa.DataType) -> tuple[list[int], pa.DataType]:
    """Row shape and value type of a (nested) fixed-size list or a fixed-shape tensor."""
    if isinstance(column_type, pa.FixedShapeTensorType):
        return list(column_type.shape), column_type.value_type
    shape = []
    while pa.types.is_fixed_size_list(column_type):
        shape.append(column_type.list_size)
        column_type = column_type.value_type
    return shape, column_type


def _variable_list_to_numpy(column: pa.Array) -> np.ndarray:
    """One 1-D array per row, in an object array (views of one decoded array of all values)."""
    values = column_to_numpy(column.flatten())
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
    out = np.empty(len(column), dtype=object)
    if len(column):
        for row, part in enumerate(np.split(values, np.cumsum(lengths)[:-1])):
            out[row] = part
    return out


def column_to_numpy(column: pa.Array) -> np.ndarray:
    """Zero-copy where Arrow allows it: tensors reshape, primitives view the buffer."""
    if isinstance(column.type, pa.FixedShapeTensorType):
        return column.to_numpy_ndarray()
    if pa.types.is_fixed_size_list(column.type):
        shape, _ = _fixed_shape(column.type)
        values = column.flatten()
        while pa.types.is_fixed_size_list(values.type):
            values = values.flatten()
        return _to_numpy(values).reshape(len(column), *shape)
    if _is_variable_list(column.type):
        return _variable_list_to_numpy(column)
    return _to_numpy(column)


def _to_numpy(column: pa.Array) -> np.ndarray:
    """Numbers without nulls as a view of their data buffer, the rest through ``to_numpy``, which imports
    pandas (seconds, on the thread that decodes a reader's first block)."""
    value_type = column.type
    if _is_number(value_type) and not pa.types.is_boolean(value_type) and column.null_count == 0:
        dtype = np.dtype(_numpy_name(value_type))
        return np.frombuffer(column.buffers()[1], dtype, len(column), column.offset * dtype.itemsize)
    return column.to_numpy(zero_copy_only=False)


def batch_to_numpy(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    return {name: column_to_numpy(batch.column(i)) for i, name in enumerate(batch.schema.names)}


def _column_of_type(values: np.ndarray, column_type: pa.DataType) -> pa.Array:
    """``column_to_numpy``'s inverse for a column of ``column_type``: zero-copy for tensors and numbers."""
    if isinstance(column_type, pa.FixedShapeTensorType):
        storage = _column_of_type(values.reshape(len(values), -1), column_type.storage_type)
        return pa.ExtensionArray.from_storage(column_type, storage)
    if pa.types.is_fixed_size_list(column_type):
        inner = _column_of_type(values.reshape(-1, *values.shape[2:]), column_type.value_type)
        return pa.FixedSizeListArray.from_arrays(inner, type=column_type)
    return pa.array(values, type=column_type)


def numpy_to_record_batch(schema: pa.Schema, arrays: Mapping[str, np.ndarray]) -> pa.RecordBatch:
    """A batch of ``schema`` from ``batch_to_numpy``'s output for that schema (``batch_to_numpy``'s inverse).

    Unlike ``record_batch_from_arrays``, which infers types, the columns get
    exactly the types ``schema`` names: a service worker that gathered a
    snapshot's rows with NumPy sends them in the snapshot's own schema.
    """
    return pa.RecordBatch.from_arrays(
        [_column_of_type(np.ascontiguousarray(arrays[field.name]), field.type) for field in schema], schema=schema
    )


def _numpy_name(value_type: pa.DataType) -> str:
    """The NumPy dtype name of a number type, from its width: pyarrow's ``to_pandas_dtype`` and
    ``to_numpy`` import pandas (2.5 s on a loaded 2-core machine, in every reader's first batch)."""
    if pa.types.is_boolean(value_type):
        return "bool"
    if pa.types.is_floating(value_type):
        return f"float{value_type.bit_width}"
    return f"{'u' if pa.types.is_unsigned_integer(value_type) else ''}int{value_type.bit_width}"


def _value_dtype(value_type: pa.DataType) -> str:
    if pa.types.is_binary(value_type) or pa.types.is_large_binary(value_type):
        return "binary"
    if pa.types.is_string(value_type) or pa.types.is_large_string(value_type):
        return "string"
    if _is_number(value_type):
        return _numpy_name(value_type)
    return str(value_type)  # not readable: the reader names the column (old snapshots only)


def _spec(field: pa.Field) -> ColumnSpec:
    field_type = field.type
    if isinstance(field_type, pa.FixedShapeTensorType) or pa.types.is_fixed_size_list(field_type):
        shape, value_type = _fixed_shape(field_type)
        return ColumnSpec(name=field.name, dtype=_value_dtype(value_type), shape=shape, is_tensor=True)
    if _is_variable_list(field_type):
        return ColumnSpec(name=field.name, dtype=_value_dtype(field_type.value_type), shape=[VARIABLE])
    return ColumnSpec(name=field.name, dtype=_value_dtype(field_type))


def column_specs(schema: pa.Schema) -> list[ColumnSpec]:
    """Name, dtype and per-row shape of every column, as the manifest records them.

    A variable-length list has shape ``[VARIABLE]`` and the dtype of its values.
    """
    return [_spec(field) for field in schema]


def describe_schema_difference(expected: pa.Schema, actual: pa.Schema) -> str:
    """A one-line account of how two schemas differ, for mismatch errors."""
    expected_fields = {f.name: f.type for f in expected}
    actual_fields = {f.name: f.type for f in actual}
    parts = []
    if missing := [n for n in expected_fields if n not in actual_fields]:
        parts.append(f"missing columns {missing}")
    if added := [n for n in actual_fields if n not in expected_fields]:
        parts.append(f"new columns {added}")
    for name in expected_fields.keys() & actual_fields.keys():
        if expected_fields[name] != actual_fields[name]:
            parts.append(f"column {name!r} {expected_fields[name]} -> {actual_fields[name]}")
    if not parts and expected.names != actual.names:
        parts.append(f"column order {expected.names} -> {actual.names}")
    return "; ".join(sorted(parts)) or "schema metadata differs"


def check_same_schema(first: pa.Schema | None, schema: pa.Schema, producer: str, where: str = "") -> pa.Schema:
    """The schema every batch of a snapshot has: ``first``'s, or ``schema`` when it is the first batch's.

    The one check of every step that sees batches one after another (the
    preprocessing function's outputs, the shard writers' inputs, finalize's
    shards): a later ``schema`` that differs raises ``SchemaMismatchError``
    naming ``producer``, how the schemas differ and ``where`` (appended as is).
    """
    if first is None:
        return schema
    if schema.equals(first):
        return first
    raise SchemaMismatchError(
        f"{producer} changed its output schema between batches ({describe_schema_difference(first, schema)}){where}. "
        f"Return the same columns and dtypes for every batch (cast explicitly, or give TFRecord input a --schema), "
        f"then rerun."
    )
