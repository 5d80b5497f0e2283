"""Turning runner failures into clear errors (pure functions, real files)."""

import io

from beam_jobs import failures
from schemas.errors import PreprocessingError, SchemaMismatchError


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


def test_csv_scan_names_the_line():
    data = b"a,b,c\n1,2,3\n4,5\n"
    problem = failures.find_csv_row_problem(io.BytesIO(data), expected_columns=3, skip_header_lines=1)
    assert problem.startswith("line 3 has 2 columns, expected 3")
