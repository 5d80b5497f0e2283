"""Raw input: matching files through Beam FileSystems and reading them as Arrow.

The files are read as planned pieces in plain DoFns (``beam_jobs.inputs.plan``,
``beam_jobs.inputs.piece_readers``): TFRecord tf.Examples decoded by tfx-bsl's
example decoder, CSV lines by tfx-bsl's CSV decoder, Parquet row groups by
pyarrow. Every format yields ``pyarrow.RecordBatch`` elements. With
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
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from beam_jobs import failures
from beam_jobs.inputs import csv_types, piece_readers
from beam_jobs.inputs.piece_readers import open_raw
from beam_jobs.inputs.plan import Piece
from schemas import columns, fingerprint, paths, stores
from schemas.errors import InputDataError, StorageError, UsageError
from schemas.snapshot_pb2 import InputFile

DEFAULT_BATCH_SIZE = 1024


#: Object stores whose bucket is reached once, quickly, before Beam lists the patterns.
_CHECKED_SCHEMES = ("gs", "s3")


def _check_stores(patterns: tuple[str, ...]) -> None:
    """Each object store bucket the patterns name answers one request, without retries, in seconds.

    Beam's match retries a store it cannot reach for 120 s (gs://) and then
    fails with a BeamIOError naming no cause. The store's own check (the one
    --output gets) says which of network, endpoint, credentials or bucket is
    wrong, naming the path.
    """
    for pattern in patterns:
        if paths.scheme(pattern) in _CHECKED_SCHEMES:
            try:
                stores.store_for(pattern).check_credentials(pattern)
            except StorageError as exc:  # it names the path: named once, as the flag
                cause = str(exc).removeprefix(f"{pattern}: ").replace(f" for {pattern}", "")
                raise StorageError(f"--input={pattern}: {cause}") from None


def _match(patterns: tuple[str, ...]) -> list:
    """Beam's match of every pattern; a store failing past the check above is one line naming the patterns."""
    _check_stores(patterns)
    try:
        return FileSystems.match(list(patterns))
    except BeamIOError as exc:
        causes = "; ".join(f"{path}: {failures.describe(cause)}" for path, cause in exc.exception_details.items())
        raise StorageError(
            f"--input cannot be listed ({causes}): check the path, the network and credentials."
        ) from exc


def match_input_files(patterns: tuple[str, ...], fingerprint_inputs: str) -> list[InputFile]:
    """Every file the patterns match, with the identity the fingerprint uses."""
    files: dict[str, InputFile] = {}
    for pattern, result in zip(patterns, _match(patterns), strict=True):
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


def densify(batch: pa.RecordBatch, shapes: dict[str, tuple[int, ...]]) -> pa.RecordBatch:
    """TFXIO list columns of fixed-shape features -> scalars or fixed-shape tensors."""
    arrays = []
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        is_list = pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
        if is_list and name in shapes:
            column = _densify_column(name, column, shapes[name], batch.num_rows)
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


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


class ReadRecordBatches(beam.PTransform):
    """Reads the planned input pieces of one format as ``pyarrow.RecordBatch`` elements.

    Reads exactly ``pieces`` (planned by ``beam_jobs.inputs.plan`` from the file
    list the fingerprint was computed from), reshuffled so every runner spreads
    them over its workers, each in a plain DoFn (``beam_jobs.inputs.piece_readers``).
    """

    def __init__(
        self,
        *,
        input_format: str,
        pieces: tuple[Piece, ...],
        schema: schema_pb2.Schema | None = None,
        csv_column_names: tuple[str, ...] = (),
        csv_skip_header_lines: int = 0,
        batch_size: int = DEFAULT_BATCH_SIZE,
        tfxio_form: bool = False,
    ) -> None:
        """``tfxio_form``: keep TFXIO's list columns (what tf.Transform reads) instead of dense ones."""
        super().__init__()
        self._format = input_format
        self._pieces = list(pieces)
        self._schema = schema
        self._csv_column_names = list(csv_column_names)
        self._csv_skip_header_lines = csv_skip_header_lines
        self._batch_size = batch_size
        self._tfxio_form = tfxio_form

    def _read(self, pieces):
        if self._format == "tfrecord":
            return pieces | "ReadExamples" >> beam.ParDo(piece_readers.ReadExamples(self._schema, self._batch_size))
        if self._format == "parquet":
            return (
                pieces
                | "SplitRowGroups" >> beam.ParDo(piece_readers.SplitRowGroups())
                | "SpreadRowGroups" >> beam.Reshuffle()
                | "ReadRowGroups" >> beam.ParDo(piece_readers.ReadRowGroup(self._batch_size))
            )
        from tfx_bsl.public import tfxio

        # tfx-bsl's CSV decoder over the lines: the same column types (inferred over every line) and
        # errors as its CsvTFXIO source, without that source's beam.io.Read.
        decode = (
            csv_types.DecodeCsv(self._csv_column_names, self._batch_size)
            if self._parquet_typed_csv
            else tfxio.BeamRecordCsvTFXIO(
                physical_format="text", column_names=self._csv_column_names, schema=self._schema
            ).BeamSource(self._batch_size)
        )
        return (
            pieces
            | "ReadCsvLines" >> beam.ParDo(piece_readers.ReadCsvLines(self._csv_skip_header_lines))
            | "DecodeCsv" >> decode
        )

    @property
    def _parquet_typed_csv(self) -> bool:
        """CSV whose types are inferred: read as int64, float64 and string columns (``csv_types``)."""
        return csv_types.applies(self._format, self._schema, self._tfxio_form)

    def expand(self, pipeline):
        pieces = pipeline | "ListPieces" >> beam.Create(self._pieces) | "SpreadPieces" >> beam.Reshuffle()
        batches = self._read(pieces)
        shapes = fixed_shapes(self._schema) if self._schema is not None else {}
        if shapes and not self._tfxio_form:
            batches = batches | "DenseColumns" >> beam.Map(densify, shapes)
        return batches
