"""The raw features a tf.Transform ``preprocessing_fn`` gets: their TFMD schema, and batches in TFXIO's form.

tf.Transform reads Arrow RecordBatches through a ``TensorAdapterConfig``: every
column a list column (``large_list`` of int64, float32 or large_binary) and a
tensor representation per feature (dense ``[batch, *shape]`` for features of a
fixed shape, sparse or ragged for the others), all known when the function is
traced, in the driver, before a row is read. So the driver decides the raw
schema, from:

- ``--schema`` (a TFMD schema, any format): as given; a feature with a
  ``shape`` is required in every row (what the instance-level job's dense
  columns assume too), so its presence becomes 1;
- TFRecord without ``--schema``: refused (a tf.Example says nothing of types
  and shapes until every record is read);
- CSV without ``--schema``: inferred from the first lines of the files,
  with tfx-bsl's own CSV type inference (INT < FLOAT < STRING); a column with
  a value in every sampled line is a dense scalar, one with empty cells an
  optional (sparse) one; the decoder then parses every line with that schema,
  so a later value of another type is an error naming the column, never
  another type for one batch;
- Parquet without ``--schema``: from the first file's Arrow schema; a column
  with nulls in any file's footer statistics is optional, the others dense.

The batches the job reads for tf.Transform skip the instance-level path's dense
columns (``ReadRecordBatches(tfxio_form=True)``); ``to_tfxio`` casts what is
left (Parquet's plain columns) to TFXIO's list columns.
"""

from __future__ import annotations

import csv
import io
import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tensorflow_metadata.proto.v0 import schema_pb2

from beam_jobs.inputs.piece_readers import open_raw
from schemas.errors import InputDataError, UsageError

#: Lines of the first CSV file whose values decide the column types when no ``--schema`` is given.
CSV_SAMPLE_LINES = 10_000

_ARROW_VALUE_TYPES = {schema_pb2.INT: pa.int64(), schema_pb2.FLOAT: pa.float32(), schema_pb2.BYTES: pa.large_binary()}


def raw_schema(
    *,
    input_format: str,
    schema: schema_pb2.Schema | None,
    files: list[str],
    csv_column_names: tuple[str, ...],
    csv_skip_header_lines: int,
) -> schema_pb2.Schema:
    """The TFMD schema of the raw features a tf.Transform function gets (see the module docstring)."""
    if schema is not None:
        return _required_where_shaped(schema)
    if input_format == "tfrecord":
        raise UsageError(
            "--tft_preprocessing_fn with TFRecord input needs --schema=schema.pbtxt (a TFMD schema): tf.Transform "
            "traces the function over the raw features' types and shapes before reading, and a tf.Example does "
            "not say them"
        )
    if input_format == "csv":
        return infer_csv_schema(files, list(csv_column_names), csv_skip_header_lines)
    return parquet_schema(files)


def _required_where_shaped(schema: schema_pb2.Schema) -> schema_pb2.Schema:
    required = schema_pb2.Schema()
    required.CopyFrom(schema)
    for feature in required.feature:
        if feature.HasField("shape"):
            feature.presence.min_fraction = 1.0
    return required


def _feature(schema: schema_pb2.Schema, name: str, kind: int, *, dense: bool) -> None:
    feature = schema.feature.add(name=name, type=kind)
    if dense:
        feature.presence.min_fraction = 1.0
        feature.shape.SetInParent()  # a scalar: shape []
    else:
        feature.value_count.min = 0
        feature.value_count.max = 1


def infer_csv_schema(files: list[str], column_names: list[str], skip_header_lines: int) -> schema_pb2.Schema:
    """Column types from the first ``CSV_SAMPLE_LINES`` lines of the files (in order), as tfx-bsl's CSV decoder
    infers them."""
    from tfx_bsl.coders import csv_decoder

    inferrer = csv_decoder.ColumnTypeInferrer(column_names, skip_blank_lines=True)
    types = inferrer.create_accumulator()
    empty: set[str] = set()
    sampled = 0
    for path in files:
        with open_raw(path) as stream:
            text = io.TextIOWrapper(stream, encoding="utf-8", newline="")
            lines = itertools.islice(
                csv.reader(text), skip_header_lines, skip_header_lines + CSV_SAMPLE_LINES - sampled
            )
            for number, cells in enumerate(lines, start=skip_header_lines + 1):
                if not cells:
                    continue
                if len(cells) != len(column_names):
                    raise InputDataError(
                        f"{path}: line {number} has {len(cells)} values for the {len(column_names)} columns "
                        f"{column_names}; fix the file, or pass --csv_column_names"
                    )
                types = inferrer.add_input(types, [cell.encode("utf-8") for cell in cells])
                empty |= {name for name, cell in zip(column_names, cells, strict=True) if not cell}
                sampled += 1
        if sampled >= CSV_SAMPLE_LINES:
            break
    if not sampled:
        raise InputDataError(
            f"the input has no rows ({', '.join(files[:3])}{', ...' if len(files) > 3 else ''} hold only a header): "
            f"tf.Transform's analyzers have nothing to analyze; check --input"
        )
    schema = schema_pb2.Schema()
    kinds = {
        csv_decoder.ColumnType.INT: schema_pb2.INT,
        csv_decoder.ColumnType.FLOAT: schema_pb2.FLOAT,
        csv_decoder.ColumnType.STRING: schema_pb2.BYTES,
    }
    for info in inferrer.extract_output(types):
        if info.type not in kinds:
            raise InputDataError(
                f"column {info.name!r} is empty in the first {sampled} rows of the input, so its type is unknown; "
                f"pass --schema=schema.pbtxt (a TFMD schema) naming its type"
            )
        _feature(schema, info.name, kinds[info.type], dense=info.name not in empty)
    return schema


def parquet_schema(files: list[str]) -> schema_pb2.Schema:
    """Features from the first file's Arrow schema; optional where any file's footer counts a null."""
    import pyarrow.parquet as pq

    with open_raw(files[0]) as stream:
        arrow = pq.read_schema(stream)
    with_nulls: set[str] = set()
    for path in files:
        with open_raw(path) as stream:
            meta = pq.ParquetFile(stream).metadata
        for group in range(meta.num_row_groups):
            row_group = meta.row_group(group)
            for index in range(row_group.num_columns):
                column = row_group.column(index)
                stats = column.statistics
                if stats is None or not stats.has_null_count or stats.null_count:
                    with_nulls.add(column.path_in_schema.split(".", 1)[0])
    schema = schema_pb2.Schema()
    for field in arrow:
        kind, shape = _tfmd_type(field)
        if kind is None:
            raise UsageError(
                f"{files[0]}: column {field.name!r} is {field.type}, which tf.Transform cannot read; give "
                f"tf.Transform numbers, strings or lists of them (or drop the column before materializing)"
            )
        if shape is None:  # a list of any length: a ragged (sparse) feature
            schema.feature.add(name=field.name, type=kind)
        elif field.name in with_nulls:
            _feature(schema, field.name, kind, dense=False)
        else:
            feature = schema.feature.add(name=field.name, type=kind)
            feature.presence.min_fraction = 1.0
            feature.shape.dim.extend(schema_pb2.FixedShape.Dim(size=size) for size in shape)
    return schema


def _tfmd_type(field: pa.Field) -> tuple[int | None, tuple[int, ...] | None]:
    """The TFMD type of a column and its fixed shape (None: a list of any length)."""
    value, shape = field.type, ()
    if isinstance(value, pa.ExtensionType):
        value = value.storage_type
    while pa.types.is_fixed_size_list(value):
        shape, value = (*shape, value.list_size), value.value_type
    if pa.types.is_list(value) or pa.types.is_large_list(value):
        value, shape = value.value_type, None
    if pa.types.is_integer(value) or pa.types.is_boolean(value):
        return schema_pb2.INT, shape
    if pa.types.is_floating(value):
        return schema_pb2.FLOAT, shape
    if pa.types.is_string(value) or pa.types.is_binary(value) or pa.types.is_large_string(value):
        return schema_pb2.BYTES, shape
    if pa.types.is_large_binary(value):
        return schema_pb2.BYTES, shape
    return None, shape


def tfxio_arrow_schema(schema: schema_pb2.Schema) -> pa.Schema:
    """The Arrow schema of batches in TFXIO's form: a list column per feature."""
    return pa.schema([pa.field(f.name, pa.large_list(_ARROW_VALUE_TYPES[f.type])) for f in schema.feature])


def tensor_adapter_config(schema: schema_pb2.Schema):
    """What tf.Transform reads the batches through: their Arrow schema and a tensor per feature."""
    from tfx_bsl.tfxio import tensor_adapter, tensor_representation_util

    representations = tensor_representation_util.InferTensorRepresentationsFromSchema(schema)
    return tensor_adapter.TensorAdapterConfig(tfxio_arrow_schema(schema), representations)


def to_tfxio(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` with the columns of ``target`` (TFXIO's form): list columns pass (cast if another value type),
    plain ones become lists of one value (a null: an empty list), fixed-size lists become plain lists."""
    arrays = []
    for field in target:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            raise InputDataError(
                f"a batch of the input lacks column {field.name!r} of the raw schema (it has {batch.schema.names})"
            )
        arrays.append(_as_list(batch.column(index), field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def _as_list(column: pa.Array, target: pa.DataType) -> pa.Array:
    if isinstance(column, pa.ExtensionArray):
        column = column.storage  # a fixed-shape tensor column: its fixed-size lists
    if column.type == target:
        return column
    if pa.types.is_fixed_size_list(column.type):
        if column.null_count:
            raise InputDataError(f"a tensor column of type {column.type} has missing rows; tf.Transform reads it dense")
        values, per_row = column, 1
        while pa.types.is_fixed_size_list(values.type):  # a tensor of rank > 1: row-major, as tf.Example holds it
            values, per_row = pc.list_flatten(values), per_row * values.type.list_size
        offsets = np.arange(len(column) + 1, dtype=np.int64) * per_row
    elif pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        values = pc.list_flatten(column)
        lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    else:
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        values = column.drop_null()
        offsets = np.concatenate([[0], np.cumsum(valid)]).astype(np.int64)
    return pa.LargeListArray.from_arrays(pa.array(offsets), values.cast(target.value_type))
