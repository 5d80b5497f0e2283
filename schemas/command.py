"""The one error edge of every snapfeed command line (materialize, ``snapfeed``, ``reader.service``).

A command ends with one line on stderr saying what went wrong, never a
traceback flood: ``error: ...`` (or ``usage error: ...``) and the exit code of
the error class (``schemas.errors``). Tracebacks, and the records libraries log
while failing (Beam re-logs a worker's traceback once per retry), go to a log
file that the last line names; ``--verbose`` shows everything on stderr instead.
Log records are kept in memory and written only when the command fails, so a
successful run leaves no file behind.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import importlib.abc
import importlib.util
import logging
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence

from schemas.errors import EXIT_FAILURE, SnapfeedError, UsageError

VERBOSE_FLAG = "--verbose"
VERBOSE_HELP = "show every log record and the full traceback of a failure on stderr"
#: Loggers whose errors are tracebacks of what the command reports in its last line anyway.
LOG_FILE_ONLY = ("apache_beam",)
_KEPT_RECORDS = 20_000
_EXIT_INTERRUPTED = 128 + signal.SIGINT
#: What a shell reports for a command whose reader went away (``snapfeed list | head``): killed by SIGPIPE.
_EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are ``UsageError``s, so they end like any other error: one line, exit 2."""

    def error(self, message: str):
        raise UsageError(f"{message} (see `{self.prog} --help`)") from None


def one_line(text: str) -> str:
    """``text`` on one line, whole: a message is never cut, least of all at its start."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


class _RecentRecords(logging.Handler):
    """The latest log records, formatted, for the log file of a failed command."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: collections.deque[str] = collections.deque(maxlen=_KEPT_RECORDS)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


class _ConsoleFilter(logging.Filter):
    """Keeps a library's failure reports (errors, tracebacks) off the console; our own records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        library = record.name.split(".", 1)[0] in LOG_FILE_ONLY
        return not (library and (record.levelno >= logging.ERROR or record.exc_info))


class _DivertedTracebacks:
    """stderr, less the tracebacks libraries print themselves (Beam's SDK worker prints each failed bundle's).

    Those go to the kept records, with the blank line ``print`` adds after them.
    """

    def __init__(self, console, recent: _RecentRecords) -> None:
        self._console = console
        self._recent = recent
        self._after_traceback = False

    def write(self, text: str) -> int:
        if text.startswith("Traceback (most recent call last)"):
            self._recent.lines.append(text.rstrip("\n"))
            self._after_traceback = True
            return len(text)
        if self._after_traceback and text == "\n":
            self._after_traceback = False
            return len(text)
        self._after_traceback = False
        return self._console.write(text)

    def __getattr__(self, name: str):
        return getattr(self._console, name)


@contextlib.contextmanager
def _quiet_console(verbose: bool) -> Iterator[_RecentRecords]:
    """Our records (warnings, progress) on stderr; libraries' failure reports only in the kept records."""
    recent = _RecentRecords()
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    console.setLevel(logging.INFO if verbose else logging.WARNING)
    if not verbose:
        console.addFilter(_ConsoleFilter())
    root, stderr = logging.getLogger(), sys.stderr
    level = root.level
    root.addHandler(console)
    root.addHandler(recent)
    root.setLevel(logging.INFO)
    if not verbose:
        sys.stderr = _DivertedTracebacks(stderr, recent)
    try:
        yield recent
    finally:
        sys.stderr = stderr
        root.removeHandler(console)
        root.removeHandler(recent)
        root.setLevel(level)


def _write_log(name: str, recent: _RecentRecords, exc: BaseException) -> str:
    """Writes the kept records and the traceback to a new log file; returns its path."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    fd, path = tempfile.mkstemp(prefix=f"snapfeed-{name}-{stamp}-", suffix=".log")
    with os.fdopen(fd, "w") as log:
        log.write("\n".join(recent.lines) + "\n\n")
        log.write("".join(traceback.format_exception(exc)))
    return path


#: What TensorFlow's C++ runtime prints while it loads, before anything can set its logging up (TF_CPP_MIN_LOG_LEVEL
#: does not reach these lines): on every run of a command, and never a problem.
NATIVE_STARTUP_NOISE = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "cudart_stub.cc",
    "cuda_platform.cc",
    "cuda_executor.cc",
    "cpu_feature_guard.cc",
    "port.cc:153] oneDNN custom operations are on",
    "To enable the following instructions",
)


@contextlib.contextmanager
def _native_noise_dropped() -> Iterator[None]:
    """The process's stderr (file descriptor 2, which C++ writes to) caught meanwhile, then passed on without
    ``NATIVE_STARTUP_NOISE``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.writelines(line for line in lines if not any(noise in line for noise in NATIVE_STARTUP_NOISE))
            sys.stderr.flush()


class _QuietLoader(importlib.abc.Loader):
    """A module's own loader, run with the native start-up noise dropped."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        with _native_noise_dropped():
            self._loader.exec_module(module)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)  # resources, source, ...: the real loader's


class _QuietFirstImport(importlib.abc.MetaPathFinder):
    """Finds ``module`` once, as Python would, and hands it a ``_QuietLoader``."""

    def __init__(self, module: str) -> None:
        self.module = module

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)  # once: the real finders find it
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


@contextlib.contextmanager
def quiet_first_import(module: str, argv: Sequence[str]) -> Iterator[None]:
    """While a command runs, the first import of ``module`` (``tensorflow``), by whatever needs it (tfx-bsl,
    tf.Transform, the user's function), drops ``NATIVE_STARTUP_NOISE`` from stderr, and a command that never needs
    it (a flag mistake, a reuse) never loads it. ``--verbose`` shows everything."""
    if VERBOSE_FLAG in argv or module in sys.modules:
        yield
        return
    finder = _QuietFirstImport(module)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


def run(name: str, body: Callable[[], int], argv: Sequence[str]) -> int:
    """Runs ``body`` (the command) and turns whatever it raises into one line and an exit code.

    ``name`` names the log file; ``argv`` is only searched for ``--verbose``,
    which the command's own parser must also accept (``VERBOSE_HELP``).
    """
    verbose = VERBOSE_FLAG in argv
    with _quiet_console(verbose) as recent:

        def fail(prefix: str, message: str, exc: BaseException, code: int, *, log: bool) -> int:
            if verbose:
                traceback.print_exception(exc, file=sys.stderr)
            elif log:
                message += f" (full traceback: {_write_log(name, recent, exc)})"
            print(f"{prefix}: {one_line(message)}", file=sys.stderr, flush=True)
            return code

        try:
            return body()
        except BrokenPipeError:
            # The reader of stdout closed it (``| head``): nothing is wrong and nothing more can be said there.
            # Later writes (the interpreter flushes stdout at exit) go nowhere instead of raising again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return _EXIT_BROKEN_PIPE
        except KeyboardInterrupt as exc:
            return fail("error", "interrupted (Ctrl-C)", exc, _EXIT_INTERRUPTED, log=False)
        except SnapfeedError as exc:
            prefix = "usage error" if isinstance(exc, UsageError) else "error"
            explained = exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__)
            return fail(prefix, str(exc), exc, exc.exit_code, log=explained)
        except Exception as exc:  # noqa: BLE001 - the edge of the program: a bug still ends in one line
            message = (
                f"unexpected {type(exc).__name__}: {exc}. This is a bug in snapfeed; please report it with the log"
            )
            return fail("error", message, exc, EXIT_FAILURE, log=True)
