"""Turning runner failures into clear errors (pure functions, real files)."""

import io
import traceback

from beam_jobs import failures
from schemas.errors import PreprocessingError, SchemaMismatchError, SnapfeedError, SnapshotInProgressError


def _relayed(error: BaseException) -> RuntimeError:
    """What the Fn API hands the driver for a worker's exception: its formatted traceback as text."""
    try:
        raise error
    except BaseException:  # noqa: BLE001 - formatting whatever was raised, as the SDK worker does
        return RuntimeError(traceback.format_exc())


def test_error_text_from_another_process_is_recovered():
    relayed = _relayed(PreprocessingError("preprocessing_fn m:f raised ValueError: bad [while running 'Preprocess']"))
    error = failures.recover_snapfeed_error(relayed)
    assert isinstance(error, PreprocessingError)
    assert str(error) == "preprocessing_fn m:f raised ValueError: bad"


def test_a_class_name_in_plain_text_is_not_taken_for_our_error():
    text = "Traceback (most recent call last):\nschemas.errors.PreprocessingError: looks like ours\n"
    assert failures.recover_snapfeed_error(RuntimeError(text)) is None


def test_an_error_needing_more_than_a_message_comes_back_as_a_snapfeed_error():
    relayed = _relayed(SnapshotInProgressError("held by run r", run_id="r", start_time=0.0))
    error = failures.recover_snapfeed_error(relayed)
    assert type(error) is SnapfeedError and str(error) == "held by run r"


def test_an_unknown_failure_is_described_by_its_last_exception_line_whole():
    relayed = _relayed(SystemExit("x" * 3000 + " the end"))
    assert failures.describe(relayed) == "SystemExit: " + "x" * 3000 + " the end"
    assert failures.describe(ValueError("one\ntwo")) == "ValueError: one two"


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


def test_csv_scan_names_the_line():
    data = b"a,b,c\n1,2,3\n4,5\n"
    problem = failures.find_csv_row_problem(io.BytesIO(data), expected_columns=3, skip_header_lines=1)
    assert problem.startswith("line 3 has 2 columns, expected 3")


def test_a_binary_file_read_as_csv_is_named(tmp_path):
    text, binary = tmp_path / "a.csv", tmp_path / "b.csv"
    text.write_text("a,b\n1,2\n")
    binary.write_bytes(b"a,b\n\xa9\x01")
    exc = UnicodeDecodeError("utf-8", b"\xa9", 0, 1, "invalid start byte")
    error = failures.diagnose_csv(
        exc,
        files=[str(text), str(binary)],
        open_file=lambda p: open(p, "rb"),
        column_names=("a", "b"),
        skip_header_lines=1,
    )
    assert str(error).startswith(f"{binary}: not UTF-8 text (byte 0xa9 at offset 4)")
