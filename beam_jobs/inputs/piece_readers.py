"""Reading one input piece (``beam_jobs.inputs.plan``) in a plain DoFn, for every format.

Plain DoFns over planned pieces run alike on every runner, including those
without a translation for ``beam.io.Read`` (Beam's DaskRunner) or that never
split a source. TFRecord files are framed by ``beam_jobs.inputs.tfrecord`` and decoded
by tfx-bsl's example decoder; CSV pieces yield raw lines, decoded afterwards by
tfx-bsl's CSV decoder (``inputs.ReadRecordBatches``), which infers column types
over all lines of all files; Parquet files are split into row groups, each read
with pyarrow as Beam's Parquet source reads them.
"""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from tensorflow_metadata.proto.v0 import schema_pb2

from beam_jobs.inputs import plan as input_plan
from beam_jobs.inputs import text_lines, tfrecord
from beam_jobs.inputs.plan import Piece
from schemas.errors import InputDataError


def open_raw(path: str):
    """A binary stream of the file's bytes as stored (no transparent decompression)."""
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


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


class ReadExamples(beam.DoFn):
    """One TFRecord file of tf.Examples -> RecordBatches of ``batch_size`` rows."""

    def __init__(self, schema: schema_pb2.Schema | None, batch_size: int) -> None:
        self._schema_bytes = schema.SerializeToString() if schema is not None else None
        self._batch_size = batch_size

    def setup(self) -> None:
        from tfx_bsl.coders import example_coder

        self._decoder = example_coder.ExamplesToRecordBatchDecoder(self._schema_bytes)

    def process(self, piece: Piece):
        path = piece.path
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


class ReadCsvLines(beam.DoFn):
    """The lines of one CSV piece as bytes (header lines skipped at the start of a file)."""

    def __init__(self, skip_header_lines: int) -> None:
        self._skip_header_lines = skip_header_lines

    def process(self, piece: Piece):
        # A compressed file is one whole piece, decompressed as Beam's text source would (by suffix).
        compressed = input_plan.is_compressed(piece.path)
        with FileSystems.open(piece.path) if compressed else open_raw(piece.path) as stream:
            lines = text_lines.iter_lines(stream, piece.start, piece.end)
            if piece.start == 0:
                for _ in zip(range(self._skip_header_lines), lines, strict=False):
                    pass
            yield from lines


def _open_parquet(path: str, stream) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(stream)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputDataError(
            f"{path}: not a Parquet file ({exc}). Give its real --input_format (tfrecord, csv) "
            f"or leave it out of --input."
        ) from exc


class SplitRowGroups(beam.DoFn):
    """A whole Parquet file's piece -> one piece per row group (reads only the footer)."""

    def process(self, piece: Piece):
        with open_raw(piece.path) as stream:
            yield from input_plan.row_group_pieces(piece, _open_parquet(piece.path, stream).num_row_groups)


class ReadRowGroup(beam.DoFn):
    """One Parquet row group -> RecordBatches of at most ``batch_size`` rows."""

    def __init__(self, batch_size: int) -> None:
        self._batch_size = batch_size

    def process(self, piece: Piece):
        with open_raw(piece.path) as stream:
            table = _open_parquet(piece.path, stream).read_row_group(piece.row_group)
        yield from table.to_batches(max_chunksize=self._batch_size)
