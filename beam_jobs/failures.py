"""Turning a failed pipeline into one clear error: what, where, what to do.

Runners report worker exceptions differently (the original exception with a
"[while running ...]" suffix in-process, a traceback inside a RuntimeError
across processes), so snapfeed's own errors are recovered from the text.
tfx-bsl's CSV decoder fails without naming the file or line, so after such a
failure the CSV inputs are scanned to find them: no cost on the happy path, a
precise message on the bad one.
"""

from __future__ import annotations

import csv
import io
import re

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
_CSV_DECODER_ERROR = "Columns do not match specified csv headers"


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


def find_csv_row_problem(stream, expected_columns: int, skip_header_lines: int) -> str | None:
    text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
    for line_number, row in enumerate(csv.reader(text), start=1):
        if line_number <= skip_header_lines or not row:
            continue
        if len(row) != expected_columns:
            return f"line {line_number} has {len(row)} columns, expected {expected_columns}: {','.join(row)[:120]!r}"
    return None


def diagnose_csv(
    exc: BaseException,
    *,
    files: list[str],
    open_file,
    column_names: tuple[str, ...],
    skip_header_lines: int,
) -> InputDataError | None:
    """Finds the file and line behind tfx-bsl's "columns do not match" error."""
    if _CSV_DECODER_ERROR not in str(exc):
        return None
    for path in files:
        with open_file(path) as stream:
            problem = find_csv_row_problem(stream, len(column_names), skip_header_lines)
        if problem:
            return InputDataError(
                f"{path}: {problem} ({', '.join(column_names)}). Fix the row, or pass "
                f"--csv_column_names matching the file."
            )
    return None
