"""Turning a failed pipeline into one clear error: what, where, what to do.

Runners report worker exceptions differently (the original exception with a
"[while running ...]" suffix in-process, a traceback inside a RuntimeError
across processes), so snapfeed's own errors are recovered from the text. When
a decoder failed without naming its file (Beam's TFRecord reader and tfx-bsl's
CSV decoder do not), the inputs are scanned after the failure to find the file
and position: no cost on the happy path, a precise message on the bad one.
"""

from __future__ import annotations

import csv
import io
import re
import struct

import google_crc32c

from schemas import errors
from schemas.errors import InputDataError, SnapfeedError

_OUR_ERRORS = {
    cls.__name__: cls
    for cls in (
        errors.InputDataError,
        errors.PreprocessingError,
        errors.SchemaMismatchError,
        errors.StorageError,
        errors.UsageError,
        errors.CorruptSnapshotError,
    )
}
_ERROR_LINE = re.compile(r"(?:[\w.]+\.)?(" + "|".join(_OUR_ERRORS) + r"): (.*)")
_RUNNER_SUFFIX = re.compile(r" \[while running '[^']*'\]")
_TFRECORD_HINT = ("TFRecord", "DataLossError", "corrupted record")
_CSV_HINT = ("csv headers", "CSV", "csv")


def recover_snapfeed_error(exc: BaseException) -> SnapfeedError | None:
    """Our own error raised on a worker, found in the exception chain or its text."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ in _OUR_ERRORS and isinstance(seen, SnapfeedError):
            return type(seen)(_RUNNER_SUFFIX.sub("", str(seen)).strip())
        seen = seen.__cause__ or seen.__context__
    matches = [m for line in str(exc).splitlines() if (m := _ERROR_LINE.search(line.strip()))]
    if not matches:
        return None
    name, message = matches[-1].groups()
    return _OUR_ERRORS[name](_RUNNER_SUFFIX.sub("", message).strip())


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def find_tfrecord_corruption(stream) -> str | None:
    """Walks TFRecord framing (length, masked CRC32C, data, masked CRC32C)."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.example import example_pb2

    offset, index = 0, 0
    while True:
        header = stream.read(12)
        if not header:
            return None
        if len(header) < 12:
            return f"record {index} at byte {offset}: truncated header ({len(header)} of 12 bytes)"
        length, length_crc = struct.unpack("<QI", header)
        if _masked_crc(header[:8]) != length_crc:
            return f"record {index} at byte {offset}: length checksum mismatch (not a TFRecord, or garbled)"
        body = stream.read(length + 4)
        if len(body) < length + 4:
            return f"record {index} at byte {offset}: truncated data ({len(body)} of {length + 4} bytes)"
        data, (data_crc,) = body[:length], struct.unpack("<I", body[length:])
        if _masked_crc(data) != data_crc:
            return f"record {index} at byte {offset}: data checksum mismatch (garbled bytes)"
        try:
            example_pb2.Example.FromString(data)
        except DecodeError:
            return f"record {index} at byte {offset}: not a serialized tf.Example"
        offset += 12 + length + 4
        index += 1


def find_csv_row_problem(stream, expected_columns: int, skip_header_lines: int) -> str | None:
    text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
    for line_number, row in enumerate(csv.reader(text), start=1):
        if line_number <= skip_header_lines or not row:
            continue
        if len(row) != expected_columns:
            return f"line {line_number} has {len(row)} columns, expected {expected_columns}: {','.join(row)[:120]!r}"
    return None


def diagnose_inputs(
    exc: BaseException,
    *,
    input_format: str,
    files: list[str],
    open_file,
    csv_column_names: tuple[str, ...] = (),
    csv_skip_header_lines: int = 0,
) -> InputDataError | None:
    """Scans the inputs when the failure looks like a decode error of this format."""
    text = str(exc)
    if input_format == "tfrecord" and any(hint in text for hint in _TFRECORD_HINT):
        for path in files:
            with open_file(path) as stream:
                problem = find_tfrecord_corruption(stream)
            if problem:
                return InputDataError(
                    f"{path}: {problem}. The file is not valid TFRecord of tf.Example; "
                    f"regenerate it or exclude it from --input."
                )
    if input_format == "csv" and any(hint in text for hint in _CSV_HINT):
        for path in files:
            with open_file(path) as stream:
                problem = find_csv_row_problem(stream, len(csv_column_names), csv_skip_header_lines)
            if problem:
                return InputDataError(
                    f"{path}: {problem} ({', '.join(csv_column_names)}). Fix the row, or pass "
                    f"--csv_column_names matching the file."
                )
    return None
