"""Converting between user batches (dicts of NumPy arrays) and Arrow record batches.

Fixed-shape tensors are stored as Arrow's canonical ``arrow.fixed_shape_tensor``
extension type: a fixed-size list whose shape travels in the schema, so
decoding is a zero-copy reshape and other Arrow readers still see plain lists.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from schemas.snapshot_pb2 import ColumnSpec


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


def column_to_numpy(column: pa.Array) -> np.ndarray:
    """Zero-copy where Arrow allows it: tensors reshape, primitives view the buffer."""
    if isinstance(column.type, pa.FixedShapeTensorType):
        return column.to_numpy_ndarray()
    if pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
        return column.flatten().to_numpy(zero_copy_only=False).reshape(len(column), width)
    return column.to_numpy(zero_copy_only=False)


def batch_to_numpy(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    return {name: column_to_numpy(batch.column(i)) for i, name in enumerate(batch.schema.names)}


def _spec(field: pa.Field) -> ColumnSpec:
    field_type = field.type
    if isinstance(field_type, pa.FixedShapeTensorType):
        dtype = field_type.value_type.to_pandas_dtype()
        return ColumnSpec(name=field.name, dtype=np.dtype(dtype).name, shape=list(field_type.shape), is_tensor=True)
    if pa.types.is_binary(field_type) or pa.types.is_large_binary(field_type):
        return ColumnSpec(name=field.name, dtype="binary")
    if pa.types.is_string(field_type) or pa.types.is_large_string(field_type):
        return ColumnSpec(name=field.name, dtype="string")
    try:
        return ColumnSpec(name=field.name, dtype=np.dtype(field_type.to_pandas_dtype()).name)
    except (NotImplementedError, TypeError):
        return ColumnSpec(name=field.name, dtype=str(field_type))


def column_specs(schema: pa.Schema) -> list[ColumnSpec]:
    """Name, dtype and per-row shape of every column, as the manifest records them."""
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
