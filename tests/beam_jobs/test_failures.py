"""Turning runner failures into clear errors (pure functions, real files)."""

import io
import struct

import google_crc32c

from beam_jobs import failures
from schemas.errors import PreprocessingError, SchemaMismatchError


def _masked(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked(length)) + data + struct.pack("<I", _masked(data))


def test_error_text_from_another_process_is_recovered():
    text = (
        "Traceback (most recent call last):\n  File x\n"
        "schemas.errors.PreprocessingError: preprocessing_fn m:f raised ValueError: bad "
        "[while running 'Preprocess']\n"
    )
    error = failures.recover_snapfeed_error(RuntimeError(text))
    assert isinstance(error, PreprocessingError)
    assert str(error) == "preprocessing_fn m:f raised ValueError: bad"


def test_error_in_the_exception_chain_is_recovered():
    try:
        try:
            raise SchemaMismatchError("changed [while running 'X']")
        except SchemaMismatchError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        error = failures.recover_snapfeed_error(outer)
    assert isinstance(error, SchemaMismatchError) and str(error) == "changed"


def test_unrelated_errors_are_not_claimed():
    assert failures.recover_snapfeed_error(RuntimeError("ValueError: something")) is None


def test_tfrecord_scan_finds_the_garbled_record():
    from tensorflow.core.example import example_pb2

    good = example_pb2.Example().SerializeToString()
    records = _record(good) * 3
    assert failures.find_tfrecord_corruption(io.BytesIO(records)) is None
    garbled = bytearray(records)
    garbled[len(_record(good)) + 13] ^= 0xFF
    problem = failures.find_tfrecord_corruption(io.BytesIO(bytes(garbled)))
    assert problem.startswith("record 1 at byte 16")
    assert "truncated" in failures.find_tfrecord_corruption(io.BytesIO(records[:-3]))


def test_csv_scan_names_the_line():
    data = b"a,b,c\n1,2,3\n4,5\n"
    problem = failures.find_csv_row_problem(io.BytesIO(data), expected_columns=3, skip_header_lines=1)
    assert problem.startswith("line 3 has 2 columns, expected 3")
