"""Turning a failed pipeline into one clear error: what, where, what to do.

Runners hand a worker's exception to the driver differently (the exception
itself with a " [while running ...]" suffix in-process, a traceback as text
inside a RuntimeError from the Fn API), so snapfeed's own errors are rebuilt
from the marker every ``SnapfeedError`` carries (``schemas.errors.from_marker``).
tfx-bsl's CSV decoder fails without naming the file, so after such a failure
the inputs are scanned to find it: no cost on the happy path, a precise
message on the bad one. (The Parquet reader names its file itself:
``piece_readers``.) ``explain`` is what the driver raises for any failed run.
"""

from __future__ import annotations

import codecs
import csv
import io
import re
import traceback
from typing import TYPE_CHECKING

from schemas.errors import InputDataError, SnapfeedError, from_marker

if TYPE_CHECKING:
    from beam_jobs.options import MaterializeConfig

_RUNNER_SUFFIX = re.compile(r" \[while running '[^']*'\]")
_CSV_DECODER_ERROR = "Columns do not match specified csv headers"
_NOT_UTF8 = "'utf-8' codec can't decode"
_TRACEBACK_FRAMING = ("Traceback (most recent call last)", "During handling of", "The above exception")


def recover_snapfeed_error(exc: BaseException) -> SnapfeedError | None:
    """Our own error raised on a worker, rebuilt from its marker in the exception chain and texts."""
    return from_marker(_RUNNER_SUFFIX.sub("", "".join(traceback.format_exception(exc))))


def describe(exc: BaseException) -> str:
    """A failure snapfeed did not raise, in one line: the last exception line of a relayed traceback."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    relayed = any(line.startswith(_TRACEBACK_FRAMING[0]) for line in lines)
    raised = [line for line in lines if not line[0].isspace() and not line.startswith(_TRACEBACK_FRAMING)]
    last = raised[-1] if relayed and raised else f"{type(exc).__name__}: {' '.join(lines)}"
    return _RUNNER_SUFFIX.sub("", last).strip()


def find_csv_row_problem(stream, expected_columns: int, skip_header_lines: int) -> str | None:
    text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
    for line_number, row in enumerate(csv.reader(text), start=1):
        if line_number <= skip_header_lines or not row:
            continue
        if len(row) != expected_columns:
            return f"line {line_number} has {len(row)} columns, expected {expected_columns}: {','.join(row)[:120]!r}"
    return None


def not_text_error(path: str, exc: UnicodeDecodeError, offset: int) -> InputDataError:
    """A file given as CSV that is not text (a TFRecord, a Parquet file)."""
    return InputDataError(
        f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {offset}), so not a CSV file. "
        f"Give its real --input_format (tfrecord, parquet) or leave it out of --input."
    )


def _not_text(path: str, stream) -> InputDataError | None:
    decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
    for chunk in iter(lambda: stream.read(1 << 20), b""):
        try:
            decoder.decode(chunk)
        except UnicodeDecodeError as exc:
            return not_text_error(path, exc, offset + exc.start)
        offset += len(chunk)
    return None


def diagnose_csv(
    exc: BaseException,
    *,
    files: list[str],
    open_file,
    column_names: tuple[str, ...],
    skip_header_lines: int,
) -> InputDataError | None:
    """Finds the file (and line) behind tfx-bsl's "columns do not match" or a decode error, which name none."""
    if isinstance(exc, UnicodeDecodeError) or _NOT_UTF8 in str(exc):
        for path in files:
            with open_file(path) as stream:
                problem = _not_text(path, stream)
            if problem:
                return problem
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


def explain(exc: BaseException, config: MaterializeConfig, inputs) -> SnapfeedError:
    """The one error a failed run raises: ours rebuilt, a CSV failure's file and line found, or the runner's line.

    ``inputs``: the job's resolved inputs (``materialize``'s, not imported here: the job imports this module).
    """
    from beam_jobs.inputs.piece_readers import open_raw  # Beam's FileSystems, loaded when a run failed

    ours = recover_snapfeed_error(exc)
    if ours is not None:
        return ours
    diagnosed = None
    if config.input_format == "csv":
        diagnosed = diagnose_csv(
            exc,
            files=[f.path for f in inputs.files],
            open_file=open_raw,
            column_names=inputs.csv_column_names,
            skip_header_lines=inputs.csv_skip_header_lines,
        )
    if diagnosed is not None:
        return diagnosed
    return SnapfeedError(f"the pipeline failed: {describe(exc)}")
