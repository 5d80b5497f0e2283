"""CSV columns with the Arrow types Parquet gives the same table: int64, float64 and utf8 ``string``.

tfx-bsl's CSV decoder infers each column's type over every line of every file
(INT, FLOAT or STRING), but decodes FLOAT as float32 (TensorFlow's float) and
text as ``large_binary``, so the iris CSV and the same table as Parquet made
snapshots of different schemas, and ``5.1`` read back as 5.099999904632568.
``DecodeCsv`` keeps tfx-bsl's inference (its ``ColumnTypeInferrer`` over every
line, a side input: one schema for every batch, whatever lines a batch holds,
and its "columns do not match" error that ``failures.diagnose_csv`` explains)
and parses each batch of lines with pyarrow's CSV reader at those types.
(tfx-bsl's ``raw_record_column_name``, which would give the lines beside its
own decode, breaks from a DoFn's second batch on: it appends the column's name
to its list of names on every batch.) Every line is UTF-8: it is decoded before
inference, and a file that is not fails as before, so no text column needs to
stay binary. A job with a TFMD --schema or a tf.Transform function keeps
tfx-bsl's decode: TensorFlow's types.
"""

from __future__ import annotations

import io

import apache_beam as beam
import pyarrow as pa
import pyarrow.csv as pacsv

#: The fingerprint's input format for CSV read with these types: a snapshot of the same files written before
#: (float32, large_binary columns) holds other columns, so it is not reused for this job (explain names the change).
FINGERPRINT_FORMAT = "csv (int64, float64, string)"


def applies(input_format: str, schema, tfxio_form: bool) -> bool:
    """Whether the columns are parsed here: CSV whose types are inferred (no --schema), not for tf.Transform."""
    return input_format == "csv" and schema is None and not tfxio_form


def _arrow_type(column_type) -> pa.DataType:
    from tfx_bsl.coders.csv_decoder import ColumnType

    return {
        ColumnType.INT: pa.int64(),
        ColumnType.FLOAT: pa.float64(),
        ColumnType.STRING: pa.string(),
    }.get(column_type, pa.null())  # UNKNOWN: empty in every line


def parse_lines(lines: list[str], column_infos) -> pa.RecordBatch:
    """A batch of CSV lines -> one RecordBatch of the inferred columns; an empty cell is null."""
    names = [info.name for info in column_infos]
    table = pacsv.read_csv(
        io.BytesIO("\n".join(lines).encode("utf-8")),
        read_options=pacsv.ReadOptions(column_names=names, use_threads=False),
        convert_options=pacsv.ConvertOptions(
            column_types={info.name: _arrow_type(info.type) for info in column_infos},
            null_values=[""],
            strings_can_be_null=True,
        ),
    ).combine_chunks()
    return pa.RecordBatch.from_arrays([table.column(name).chunk(0) for name in names], names=names)


class DecodeCsv(beam.PTransform):
    """CSV lines (bytes, header lines already skipped) -> RecordBatches of about ``batch_size`` rows."""

    def __init__(self, column_names: list[str], batch_size: int) -> None:
        super().__init__()
        self._column_names = list(column_names)
        self._batch_size = batch_size

    def expand(self, lines):
        from tfx_bsl.coders import csv_decoder

        text = lines | "Utf8" >> beam.Map(bytes.decode)
        column_infos = beam.pvalue.AsSingleton(
            text
            | "ParseLines" >> beam.ParDo(csv_decoder.ParseCSVLine(","))
            | "Cells" >> beam.Keys()
            | "InferTypes"
            >> beam.CombineGlobally(
                csv_decoder.ColumnTypeInferrer(column_names=self._column_names, skip_blank_lines=True)
            )
        )
        return (
            text
            | "Batch" >> beam.BatchElements(min_batch_size=self._batch_size, max_batch_size=self._batch_size)
            | "Parse" >> beam.Map(parse_lines, column_infos)
        )
