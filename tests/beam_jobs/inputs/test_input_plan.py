"""Planning input pieces and reading a byte range's lines: pure logic, checked against Beam's text source."""

from __future__ import annotations

import io
import random

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_jobs.inputs.plan import Piece, byte_ranges, plan_pieces, row_group_pieces
from beam_jobs.inputs.text_lines import iter_lines


def test_byte_ranges_tile_the_file():
    assert byte_ranges("a", 10, 4) == [Piece("a", 0, 4), Piece("a", 4, 8), Piece("a", 8, None)]
    assert byte_ranges("a", 10, 100) == [Piece("a", 0, None)]
    with pytest.raises(ValueError, match="positive"):
        byte_ranges("a", 10, 0)


def test_plan_pieces_per_format():
    files = [("x/a.csv", 10), ("x/b.csv.gz", 10), ("x/empty.csv", 0)]
    assert plan_pieces("csv", files, csv_piece_bytes=6) == [
        Piece("x/a.csv", 0, 5),
        Piece("x/a.csv", 5),
        Piece("x/b.csv.gz"),
    ]
    assert plan_pieces("tfrecord", [("a", 100), ("b", 0)]) == [Piece("a")]
    assert plan_pieces("parquet", [("a", 100)]) == [Piece("a")]
    with pytest.raises(ValueError, match="unknown input format 'json'"):
        plan_pieces("json", files)


def test_row_group_pieces():
    assert row_group_pieces(Piece("a"), 3) == [
        Piece("a", row_group=0),
        Piece("a", row_group=1),
        Piece("a", row_group=2),
    ]
    assert row_group_pieces(Piece("a"), 0) == []
    assert Piece("a", row_group=2).describe() == "a (row group 2)"
    assert Piece("a", 5, 9).describe() == "a (bytes 5-9)"


def _text(seed: int) -> bytes:
    rng = random.Random(seed)
    lines = [rng.choice([b"", b"x", b"abc,def", b"1,2,3" * rng.randint(1, 20)]) for _ in range(rng.randint(0, 60))]
    endings = [rng.choice([b"\n", b"\r\n"]) for _ in lines]
    text = b"".join(line + end for line, end in zip(lines, endings, strict=True))
    return text + rng.choice([b"", b"tail", b"tail\r"])


@pytest.mark.parametrize("seed", range(20))
def test_ranges_that_tile_a_file_yield_each_line_once_as_beam_does(tmp_path, seed):
    data = _text(seed)
    path = tmp_path / "f.txt"
    path.write_bytes(data)
    with beam.Pipeline() as pipeline:
        expected = pipeline | beam.io.ReadFromText(str(path), coder=beam.coders.BytesCoder())
        assert_that(expected, equal_to(_lines_by_ranges(data, seed)))


def _lines_by_ranges(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    target = rng.randint(1, max(1, len(data)))
    lines = []
    for piece in byte_ranges("f", len(data), target):
        lines += list(iter_lines(io.BytesIO(data), piece.start, piece.end, chunk_bytes=rng.randint(1, 7)))
    return lines
