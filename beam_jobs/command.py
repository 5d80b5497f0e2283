"""The ``snapfeed-materialize`` console script: the job's command line, or one line saying it needs ``snapfeed[job]``."""

from __future__ import annotations

from beam_jobs import refused_without_beam
from schemas.errors import EXIT_USAGE


def materialize_command() -> int:
    """``beam_jobs.materialize.main``; without Apache Beam, one ``usage error:`` line and exit 2."""
    if refused_without_beam("snapfeed-materialize"):
        return EXIT_USAGE
    from beam_jobs.materialize import main

    return main()
