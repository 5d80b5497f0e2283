"""Reading planned pieces in plain DoFns, called directly on real files."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_jobs.inputs.piece_readers import ReadCsvLines, ReadRowGroup, SplitRowGroups
from beam_jobs.inputs.plan import Piece, byte_ranges, plan_pieces
from schemas.errors import InputDataError


def test_csv_byte_ranges_skip_the_header_once_and_read_every_line_once(tmp_path):
    lines = [b"id,label", *[f"{i},{i % 10}".encode() for i in range(500)]]
    path = tmp_path / "a.csv"
    path.write_bytes(b"\r\n".join(lines) + b"\r\n")
    reader = ReadCsvLines(skip_header_lines=1)
    pieces = byte_ranges(str(path), path.stat().st_size, 97)
    assert len(pieces) > 10
    assert [line for piece in pieces for line in reader.process(piece)] == lines[1:]


def test_a_compressed_csv_is_one_piece_read_decompressed(tmp_path):
    import gzip

    path = tmp_path / "a.csv.gz"
    path.write_bytes(gzip.compress(b"id\n1\n2\n"))
    (piece,) = plan_pieces("csv", [(str(path), path.stat().st_size)], csv_piece_bytes=1)
    assert list(ReadCsvLines(skip_header_lines=1).process(piece)) == [b"1", b"2"]


def test_parquet_files_are_read_row_group_by_row_group(tmp_path):
    path = tmp_path / "a.parquet"
    table = pa.table({"id": pa.array(range(1000), pa.int64()), "name": [f"n{i}" for i in range(1000)]})
    pq.write_table(table, path, row_group_size=300)
    groups = list(SplitRowGroups().process(Piece(str(path))))
    assert groups == [Piece(str(path), row_group=i) for i in range(4)]
    batches = [batch for group in groups for batch in ReadRowGroup(batch_size=128).process(group)]
    assert max(b.num_rows for b in batches) == 128
    assert pa.Table.from_batches(batches).equals(table)


def test_a_file_that_is_not_parquet_is_named(tmp_path):
    path = tmp_path / "table.parquet"
    path.write_text("id,label\n1,2\n")
    with pytest.raises(InputDataError, match=rf"{path}: not a Parquet file .*Give its real --input_format"):
        list(SplitRowGroups().process(Piece(str(path))))
