"""Logging a call that is retried in the background (a heartbeat, a lease renewal) without flooding the log.

Each new reason the call fails for is logged once, as a warning; the same
reason again is not, and a success forgets it, so a later failure is logged
again. Silence would hide a dispatcher that went away; a line per second
would bury everything else.
"""

from __future__ import annotations

import logging


class FailureLog:
    """Warns ``what: reason`` for each new reason a repeated call fails."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._logger = logger
        self._what = what
        self._reported: str | None = None

    def failed(self, reason: str) -> None:
        if reason != self._reported:
            self._logger.warning("%s: %s", self._what, reason)
            self._reported = reason

    def succeeded(self) -> None:
        self._reported = None
