"""How many rows the inputs hold, estimated in the driver so the progress line can say how long is left.

Parquet footers say it exactly (read for at most ``FOOTERS`` files, the rest
scaled by bytes). CSV lines and TFRecord records are counted in the first
``SAMPLE_BYTES`` of the first file and scaled to the inputs' bytes: exact for
a file read whole, close for files of like rows. Compressed inputs give none
(their sizes say little of their rows), nor does a sample that cannot be read:
the estimate only feeds a progress line, so it never fails a job. A function
that drops or adds rows makes it off by that much, so the line says "about".
"""

from __future__ import annotations

import struct

import pyarrow as pa
import pyarrow.parquet as pq

from beam_jobs.inputs.piece_readers import open_raw
from beam_jobs.inputs.plan import is_compressed
from schemas import storage

#: Bytes of the first file read to count CSV lines or TFRecord records per byte.
SAMPLE_BYTES = 1 << 20
#: Parquet footers read at most; more files are scaled from these by bytes.
FOOTERS = 16
#: A TFRecord record's framing: length (8) and its CRC (4) before the data, the data's CRC (4) after.
_TFRECORD_FRAMING = 16
_LENGTH = struct.Struct("<Q")


def estimate_rows(input_format: str, files, csv_skip_header_lines: int = 0) -> int | None:
    """About how many rows ``files`` (``InputFile``s with ``path`` and ``size_bytes``) hold; None if unknown."""
    sized = [f for f in files if f.size_bytes > 0]
    if not sized or any(is_compressed(f.path) for f in sized):
        return None
    total_bytes = sum(f.size_bytes for f in sized)
    try:
        if input_format == "parquet":
            sampled = sized[:FOOTERS]
            rows = sum(_parquet_rows(f.path) for f in sampled)
            return round(rows * total_bytes / sum(f.size_bytes for f in sampled))
        with open_raw(sized[0].path) as stream:
            head = stream.read(SAMPLE_BYTES)
    except (OSError, ValueError, pa.ArrowException):
        return None
    whole = len(head) >= sized[0].size_bytes
    if input_format == "csv":
        lines = head.count(b"\n") + (1 if whole and head and not head.endswith(b"\n") else 0)
        if not lines:
            return None
        return max(0, round(total_bytes * lines / len(head)) - csv_skip_header_lines * len(sized))
    bytes_per_record = _tfrecord_bytes_per_record(head)
    if not bytes_per_record:
        return None
    return round(total_bytes / bytes_per_record) or None


def _parquet_rows(path: str) -> int:
    with storage.open_random_access(path) as handle:
        return pq.ParquetFile(handle).metadata.num_rows


def _tfrecord_bytes_per_record(head: bytes) -> float | None:
    """Mean framed bytes of the records wholly inside ``head``, or the first record's if none is."""
    offset = records = 0
    while offset + _LENGTH.size <= len(head):
        (length,) = _LENGTH.unpack_from(head, offset)
        if offset + length + _TFRECORD_FRAMING > len(head):
            break
        offset += length + _TFRECORD_FRAMING
        records += 1
    if records:
        return offset / records
    if len(head) >= _LENGTH.size:
        return _LENGTH.unpack_from(head, 0)[0] + _TFRECORD_FRAMING
    return None
