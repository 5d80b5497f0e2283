"""Logging a call that is retried in the background (a heartbeat, a lease renewal) without flooding the log.

Each reason the call fails for is logged once, as a warning, however often
it repeats or alternates with another; a success forgets them, so a later
failure is logged again. Silence would hide a dispatcher that went away; a
line per second would bury everything else.
"""

from __future__ import annotations

import logging


class FailureLog:
    """Warns ``what: reason`` once for each reason a repeated call fails for, until it succeeds."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._logger = logger
        self._what = what
        self._reported: set[str] = set()

    def failed(self, reason: str) -> None:
        if reason not in self._reported:
            self._logger.warning("%s: %s", self._what, reason)
            self._reported.add(reason)

    def succeeded(self) -> None:
        self._reported.clear()
