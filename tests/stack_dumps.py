"""A pytest plugin: a test still running shortly before its timeout prints every thread's stack.

pytest-timeout (``timeout_method = "thread"``) ends a test that outlives its timeout and dumps the
Python stacks it can reach; this dumps them earlier from C, through faulthandler's own watchdog
thread, so they reach the log even when no thread can take the GIL. pytest's ``faulthandler_timeout``
does the same, but with one limit for every test: a slow test with a timeout of its own (20 minutes)
would print its stacks after 4.5 minutes of normal work. Here each test's limit is its own timeout
(its ``timeout`` mark, else the ini's ``timeout``) less ``DUMP_BEFORE_TIMEOUT_S``. Loaded by
tests/conftest.py.
"""

from __future__ import annotations

import faulthandler
import os

import pytest

#: How long before a test's timeout its stacks are printed (half the timeout, for timeouts under twice this).
DUMP_BEFORE_TIMEOUT_S = 30
_STDERR = pytest.StashKey()


def _timeout_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getini("timeout") or 0)


def pytest_configure(config: pytest.Config) -> None:
    # faulthandler writes to a file descriptor: a copy of stderr's, as pytest's capture replaces sys.stderr.
    config.stash[_STDERR] = os.fdopen(os.dup(2), "w")


def pytest_unconfigure(config: pytest.Config) -> None:
    config.stash[_STDERR].close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item):
    timeout = _timeout_of(item)
    if timeout > 0:
        dump_after = timeout - min(DUMP_BEFORE_TIMEOUT_S, timeout / 2)
        faulthandler.dump_traceback_later(dump_after, file=item.config.stash[_STDERR])
    try:
        yield
    finally:
        if timeout > 0:
            faulthandler.cancel_dump_traceback_later()
