"""Cutting the matched input files into pieces that plain DoFns read, planned in the driver.

Why not Beam's file sources: runners translate ``beam.io.Read`` differently
(Beam's DaskRunner not at all), and engines that do not split sources read
each pattern in one worker. A list of pieces is plain data: the pipeline
``Create``s it, reshuffles it over the workers and reads each piece in a
``DoFn``, which every runner runs the same way.

- TFRecord: whole files (records carry no sync marker to find a boundary by).
- CSV: byte ranges of about ``target_bytes``; a range reads the lines that
  start inside it, as Beam's text source does, so a line is read exactly once.
  Compressed files (by suffix, as Beam detects them) cannot be entered
  mid-stream and stay whole. Quoted fields spanning lines are not supported,
  as with the line-based CSV source before (tfx-bsl decodes line by line).
- Parquet: whole files here; each becomes one piece per row group on a worker
  (``row_group_pieces``), since counting row groups means reading footers.

Files of zero bytes hold no rows and get no piece (a zero-byte Parquet file
is not even readable). Free of Beam and of I/O, so it is tested directly.
"""

from __future__ import annotations

import dataclasses

#: Suffixes Beam's ``CompressionTypes.detect_compression_type`` decompresses transparently.
COMPRESSED_SUFFIXES = (".bz2", ".deflate", ".gz", ".zst", ".zstd", ".xz", ".lzma")

#: CSV byte range per piece: large enough that per-piece costs vanish, small enough to spread over workers.
DEFAULT_CSV_PIECE_BYTES = 64 << 20

FORMATS = ("tfrecord", "csv", "parquet")


@dataclasses.dataclass(frozen=True, order=True)
class Piece:
    """A part of one input file that one DoFn call reads.

    ``end`` None means to the end of the file; ``row_group`` names a Parquet
    row group (None: the whole file, before it is split on a worker).
    """

    path: str
    start: int = 0
    end: int | None = None
    row_group: int | None = None

    def describe(self) -> str:
        """Where the piece is, for error messages."""
        if self.row_group is not None:
            return f"{self.path} (row group {self.row_group})"
        if self.start or self.end is not None:
            return f"{self.path} (bytes {self.start}-{'end' if self.end is None else self.end})"
        return self.path


def is_compressed(path: str) -> bool:
    return path.lower().endswith(COMPRESSED_SUFFIXES)


def byte_ranges(path: str, size: int, target_bytes: int) -> list[Piece]:
    """``[0, size)`` cut into ranges of about ``target_bytes``, the last running to the end of the file."""
    if target_bytes < 1:
        raise ValueError(f"target_bytes must be positive, got {target_bytes}")
    count = max(1, -(-size // target_bytes))
    step = -(-size // count)
    starts = list(range(0, size, step)) or [0]
    return [Piece(path, start, end) for start, end in zip(starts, [*starts[1:], None], strict=True)]


def plan_pieces(
    input_format: str, files: list[tuple[str, int]], *, csv_piece_bytes: int = DEFAULT_CSV_PIECE_BYTES
) -> list[Piece]:
    """The pieces of ``files`` (``(path, size in bytes)``, sorted) for ``input_format``."""
    if input_format not in FORMATS:
        raise ValueError(f"unknown input format {input_format!r}; expected one of {', '.join(FORMATS)}")
    pieces: list[Piece] = []
    for path, size in files:
        if size == 0:
            continue
        if input_format == "csv" and not is_compressed(path):
            pieces.extend(byte_ranges(path, size, csv_piece_bytes))
        else:
            pieces.append(Piece(path))
    return pieces


def row_group_pieces(piece: Piece, num_row_groups: int) -> list[Piece]:
    """A whole Parquet file's piece as one piece per row group (none for a file without row groups)."""
    if piece.row_group is not None:
        return [piece]
    return [dataclasses.replace(piece, row_group=index) for index in range(num_row_groups)]
