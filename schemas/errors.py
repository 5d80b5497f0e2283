"""The one exception hierarchy of snapfeed.

Every error says what went wrong, where (a path, a column, a function), and
what to do about it. Classes subclass the builtin that fits so callers that
already catch ``ValueError`` or ``FileNotFoundError`` keep working.
"""

from __future__ import annotations

import json

# Exit codes of every snapfeed command line (materialize, snapfeed, reader.service).
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_IN_PROGRESS = 3


#: Starts the note every SnapfeedError carries (see ``SnapfeedError``); a stable, documented tag.
MARKER = "snapfeed-error: "
_CLASSES: dict[str, type[SnapfeedError]] = {}


class SnapfeedError(Exception):
    """Base class of every error snapfeed raises on purpose.

    ``exit_code`` is what a command line exits with when this error ends it.

    Each one carries a note (PEP 678) ``snapfeed-error: {"error": CLASS, "message": ...}``
    written where it is raised. Runners hand a worker's failure to the driver as
    traceback text (notes included), so ``from_marker`` rebuilds the very error
    from that one machine-readable line instead of guessing from class names.
    """

    exit_code = EXIT_FAILURE

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        _CLASSES[cls.__name__] = cls

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.add_note(MARKER + json.dumps({"error": type(self).__name__, "message": str(self)}))


_CLASSES[SnapfeedError.__name__] = SnapfeedError


def from_marker(text: str) -> SnapfeedError | None:
    """The last snapfeed error whose marker line appears in ``text`` (a traceback), rebuilt; else None.

    Classes whose constructor needs more than the message come back as a plain
    ``SnapfeedError`` with the same message.
    """
    found = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(MARKER):
            try:
                found = json.loads(stripped.removeprefix(MARKER))
            except json.JSONDecodeError:
                continue  # a marker line cut by whoever relayed the text: an earlier whole one still counts
    if not isinstance(found, dict) or found.get("error") not in _CLASSES:
        return None
    message = str(found.get("message", ""))
    try:
        return _CLASSES[found["error"]](message)
    except TypeError:
        return SnapfeedError(message)


class UsageError(SnapfeedError, ValueError):
    """A wrong option or argument (exit code 2 on the command line)."""

    exit_code = EXIT_USAGE


class InputDataError(SnapfeedError, ValueError):
    """Raw input that cannot be read: no matching file, corrupt record, bad CSV row."""


class PreprocessingError(SnapfeedError, RuntimeError):
    """The user's preprocessing function raised or returned something unusable."""


class SchemaMismatchError(SnapfeedError, ValueError):
    """Batches or shards that should share one schema do not."""


class SnapshotNotFoundError(SnapfeedError, FileNotFoundError):
    """No finalized snapshot where one was expected."""


class SnapshotInProgressError(SnapfeedError):
    """Another writer holds the snapshot (RFC PASSTHROUGH state), or its run failed or was abandoned unfinalized.

    ``live_writer`` is False when no writer can finalize it any more (the run
    failed, its process is gone, or it expired): waiting is pointless, a rerun
    of the job takes it over.
    """

    exit_code = EXIT_IN_PROGRESS

    def __init__(self, message: str, *, run_id: str, start_time: float, live_writer: bool = True) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.start_time = start_time
        self.live_writer = live_writer


class CorruptSnapshotError(SnapfeedError, IOError):
    """A shard or metadata file whose bytes do not match what the manifest says."""


class FormatVersionError(SnapfeedError, ValueError):
    """A file written by a newer, incompatible snapfeed."""


class StorageError(SnapfeedError, OSError):
    """A filesystem operation on a snapshot failed (permissions, missing scheme support)."""


class EmptySnapshotError(SnapfeedError, ValueError):
    """A run would commit no rows (empty inputs, or a function that kept none); refused unless allowed."""


class IncompleteRunError(SnapfeedError, RuntimeError):
    """A run's pipeline ended without every row it wrote reaching the commit: nothing is committed."""


class RunInterruptedError(SnapfeedError):
    """A run stopped by a signal (Ctrl-C, SIGTERM); it is marked failed so a rerun need not wait.

    Exits 128 + the signal number, as a shell reports a process killed by it.
    """

    def __init__(self, message: str, *, signal_number: int) -> None:
        super().__init__(message)
        self.signal_number = signal_number
        self.exit_code = 128 + signal_number


class ServiceUnavailableError(SnapfeedError, ConnectionError):
    """The reader service's dispatcher or every one of its workers cannot be reached."""
