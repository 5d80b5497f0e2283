"""Raw input: matching files through Beam FileSystems and reading them as Arrow.

TFRecord tf.Example files are framed by ``beam_jobs.tfrecord`` and decoded by
tfx-bsl's example decoder; CSV is read with tfx-bsl ``CsvTFXIO``; Parquet with
Beam's Parquet IO. Every format yields ``pyarrow.RecordBatch`` elements. With
a TFMD schema, features of fixed shape become dense columns (scalars, or
fixed-shape tensors) instead of TFXIO's list columns.
"""

from __future__ import annotations

import csv
import io
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from beam_jobs import failures, tfrecord
from schemas import columns, fingerprint
from schemas.errors import InputDataError, UsageError
from schemas.snapshot_pb2 import InputFile

DEFAULT_BATCH_SIZE = 1024


def open_raw(path: str):
    """A binary stream of the file's bytes as stored (no transparent decompression)."""
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def match_input_files(patterns: tuple[str, ...], fingerprint_inputs: str) -> list[InputFile]:
    """Every file the patterns match, with the identity the fingerprint uses."""
    files: dict[str, InputFile] = {}
    for pattern, result in zip(patterns, FileSystems.match(list(patterns)), strict=True):
        if not result.metadata_list:
            raise InputDataError(
                f"--input pattern {pattern!r} matches no file. Check the path and the glob "
                f"(quote it so the shell does not expand it)."
            )
        for meta in result.metadata_list:
            if fingerprint_inputs == "content":
                with open_raw(meta.path) as stream:
                    identity = fingerprint.content_identity(iter(lambda s=stream: s.read(8 << 20), b""))
            elif fingerprint_inputs == "stat":
                identity = fingerprint.stat_identity(meta.last_updated_in_seconds)
            else:
                identity = ""
            files[meta.path] = InputFile(path=meta.path, size_bytes=meta.size_in_bytes, identity=identity)
    return [files[path] for path in sorted(files)]


def read_schema(path: str) -> tuple[schema_pb2.Schema, str]:
    """The TFMD schema at ``path`` (text proto) and its text, for the fingerprint."""
    try:
        with open_raw(path) as stream:
            text = stream.read().decode("utf-8")
    except OSError as exc:
        raise UsageError(f"--schema={path} cannot be read: {exc}") from exc
    try:
        return text_format.Parse(text, schema_pb2.Schema()), text
    except text_format.ParseError as exc:
        raise UsageError(f"--schema={path} is not a valid TFMD schema text proto: {exc}") from exc


def csv_header(path: str) -> list[str]:
    """Column names from the first line of a CSV file."""
    try:
        with open_raw(path) as stream:
            first = io.TextIOWrapper(stream, encoding="utf-8", newline="").readline()
    except UnicodeDecodeError as exc:
        raise failures.not_text_error(path, exc, exc.start) from exc
    names = next(csv.reader([first]), [])
    if not names or any(not n.strip() for n in names):
        raise InputDataError(
            f"{path}: the first line {first.strip()!r} is not a header of column names. "
            f"Pass --csv_column_names=a,b,c for headerless files."
        )
    return [n.strip() for n in names]


def fixed_shapes(schema: schema_pb2.Schema) -> dict[str, tuple[int, ...]]:
    """Features whose every dimension is known: they become dense columns."""
    shapes = {}
    for feature in schema.feature:
        if feature.HasField("shape") and all(d.size > 0 for d in feature.shape.dim):
            shapes[feature.name] = tuple(d.size for d in feature.shape.dim)
    return shapes


def densify(batch: pa.RecordBatch, shapes: dict[str, tuple[int, ...]], *, all_scalars: bool = False) -> pa.RecordBatch:
    """TFXIO list columns of fixed-shape features -> scalars or fixed-shape tensors.

    ``all_scalars`` (CSV without a schema): every column holds at most one
    value per row, so it becomes a nullable scalar column.
    """
    arrays = []
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        is_list = pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
        if is_list and name in shapes:
            column = _densify_column(name, column, shapes[name], batch.num_rows)
        elif is_list and all_scalars:
            column = _nullable_scalar(column)
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def _nullable_scalar(column: pa.Array) -> pa.Array:
    """list<T> with 0 or 1 value per row -> T, empty rows as nulls."""
    lengths = column.value_lengths().fill_null(0).to_numpy(zero_copy_only=False)
    starts = column.offsets.to_numpy()[:-1]
    values = column.flatten()
    if len(values) == 0:
        return pa.nulls(len(column), type=values.type)
    taken = values.take(pa.array(np.minimum(starts - starts[0], len(values) - 1)))
    return pc.if_else(pa.array(lengths == 0), pa.scalar(None, type=values.type), taken)


def _densify_column(name: str, column: pa.Array, shape: tuple[int, ...], rows: int) -> pa.Array:
    per_row = math.prod(shape)
    lengths = column.value_lengths().fill_null(-1).to_numpy(zero_copy_only=False)
    if (lengths != per_row).any():
        bad = int(np.argmax(lengths != per_row))
        raise InputDataError(
            f"feature {name!r}: the schema gives shape {list(shape)} ({per_row} values per example) "
            f"but an example has {max(int(lengths[bad]), 0)} values. "
            f"Fix the data, or the schema's shape for {name!r}."
        )
    values = column.flatten()
    if pa.types.is_large_binary(values.type) or pa.types.is_binary(values.type):
        if per_row != 1:
            raise UsageError(
                f"feature {name!r}: bytes features can only be scalars (shape [] or [1]), not {list(shape)}"
            )
        return values.cast(pa.binary())
    flat = values.to_numpy(zero_copy_only=False)
    if per_row == 1:
        return pa.array(flat)
    return columns.record_batch_from_arrays({name: flat.reshape((rows, *shape))}).column(0)


#: What a TFMD feature type holds, as named in messages.
_SCHEMA_KINDS = {schema_pb2.INT: "integer", schema_pb2.FLOAT: "float", schema_pb2.BYTES: "bytes"}


def _value_kind(list_type: pa.DataType) -> str | None:
    """'integer', 'float' or 'bytes' for a schema-less decode's list column type."""
    values = list_type.value_type
    if pa.types.is_integer(values):
        return "integer"
    if pa.types.is_floating(values):
        return "float"
    if pa.types.is_binary(values) or pa.types.is_large_binary(values):
        return "bytes"
    return None


def _type_mismatch(schema: schema_pb2.Schema, record: bytes) -> str | None:
    """The first feature whose values in ``record`` are not of the type the schema gives it."""
    from tfx_bsl.coders import example_coder

    try:
        found = example_coder.ExamplesToRecordBatchDecoder().DecodeBatch([record]).schema
    except RuntimeError:
        return None  # not a tf.Example at all: the decoder's own message says so
    for feature in schema.feature:
        kind = _value_kind(found.field(feature.name).type) if feature.name in found.names else None
        expected = _SCHEMA_KINDS.get(feature.type)
        if kind is not None and expected is not None and kind != expected:
            return (
                f"has {kind} values in feature {feature.name!r}, but the --schema gives it type "
                f"{schema_pb2.FeatureType.Name(feature.type)}. Fix that feature's type in the schema (or the data)."
            )
    return None


class _ReadExamples(beam.DoFn):
    """One TFRecord file of tf.Examples -> RecordBatches of ``batch_size`` rows."""

    def __init__(self, schema: schema_pb2.Schema | None, batch_size: int) -> None:
        self._schema_bytes = schema.SerializeToString() if schema is not None else None
        self._batch_size = batch_size

    def setup(self) -> None:
        from tfx_bsl.coders import example_coder

        self._decoder = example_coder.ExamplesToRecordBatchDecoder(self._schema_bytes)

    def process(self, path: str):
        with open_raw(path) as stream:
            for first, records in tfrecord.iter_batches(stream, path, self._batch_size):
                yield self._decode(path, first, records)

    def _decode(self, path: str, first: int, records: list[bytes]) -> pa.RecordBatch:
        try:
            return self._decoder.DecodeBatch(records)
        except RuntimeError:
            # A failed decode leaves the decoder mid-example (it then blames another feature): use a fresh one.
            self.setup()
            for offset, record in enumerate(records):
                try:
                    self._decoder.DecodeBatch([record])
                except RuntimeError as exc:
                    raise InputDataError(f"{path}: record {first + offset} {self._problem(record, exc)}") from exc
            raise

    def _problem(self, record: bytes, exc: RuntimeError) -> str:
        """Which feature's type disagrees with the schema, else why the record is not a tf.Example."""
        if self._schema_bytes is not None:
            mismatch = _type_mismatch(schema_pb2.Schema.FromString(self._schema_bytes), record)
            if mismatch is not None:
                return mismatch
        return f"is not a valid tf.Example ({exc}). Regenerate the file or exclude it from --input."


class ReadRecordBatches(beam.PTransform):
    """Reads the inputs of one format as ``pyarrow.RecordBatch`` elements.

    TFRecord input reads exactly ``files`` (the list the fingerprint was
    computed from), one file per element, reshuffled so runners spread files
    over workers; CSV and Parquet read their patterns with splittable sources.
    """

    def __init__(
        self,
        *,
        input_format: str,
        patterns: tuple[str, ...],
        files: tuple[str, ...] = (),
        schema: schema_pb2.Schema | None = None,
        csv_column_names: tuple[str, ...] = (),
        csv_skip_header_lines: int = 0,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        super().__init__()
        self._format = input_format
        self._patterns = patterns
        self._files = files
        self._schema = schema
        self._csv_column_names = list(csv_column_names)
        self._csv_skip_header_lines = csv_skip_header_lines
        self._batch_size = batch_size

    def _source(self, pattern: str) -> beam.PTransform:
        from tfx_bsl.public import tfxio

        if self._format == "csv":
            return tfxio.CsvTFXIO(
                pattern,
                column_names=self._csv_column_names,
                schema=self._schema,
                skip_header_lines=self._csv_skip_header_lines,
            ).BeamSource(self._batch_size)
        return beam.io.ReadFromParquetBatched(pattern) | beam.FlatMap(
            lambda table, size=self._batch_size: table.to_batches(max_chunksize=size)
        )

    def _read(self, pipeline):
        if self._format == "tfrecord":
            return (
                pipeline
                | "ListFiles" >> beam.Create(list(self._files))
                | "SpreadFiles" >> beam.Reshuffle()
                | "ReadExamples" >> beam.ParDo(_ReadExamples(self._schema, self._batch_size))
            )
        per_pattern = [pipeline | f"Read[{i}]" >> self._source(pattern) for i, pattern in enumerate(self._patterns)]
        return per_pattern[0] if len(per_pattern) == 1 else per_pattern | "FlattenInputs" >> beam.Flatten()

    def expand(self, pipeline):
        batches = self._read(pipeline)
        shapes = fixed_shapes(self._schema) if self._schema is not None else {}
        all_scalars = self._format == "csv" and self._schema is None
        if shapes or all_scalars:
            batches = batches | "DenseColumns" >> beam.Map(densify, shapes, all_scalars=all_scalars)
        return batches
