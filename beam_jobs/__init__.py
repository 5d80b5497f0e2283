"""snapfeed's Beam side: the materialize job and the ``WriteSnapshot`` transform.

Names are imported lazily (PEP 562) so that ``beam_jobs.airflow`` can be
imported at DAG-parse time without importing Apache Beam or TensorFlow.
"""

from __future__ import annotations

import importlib
import sys

from schemas import extras
from schemas.errors import EXIT_USAGE

__version__ = "0.1.0"


def refused_without_beam(command: str) -> bool:
    """Says in one line (and True) that ``command`` needs ``snapfeed[job]`` when Apache Beam is not installed."""
    missing = extras.missing("apache_beam", f"{command} (snapfeed's Beam job)")
    if missing is not None:
        sys.stderr.write(f"usage error: {missing}\n")
    return missing is not None


# ``python -m beam_jobs.X`` imports this package while sys.argv[0] is still "-m" (runpy): without Beam it is told
# here, in one line, rather than by the job module's ModuleNotFoundError traceback.
if sys.argv[:1] == ["-m"] and refused_without_beam("python -m beam_jobs.materialize"):
    raise SystemExit(EXIT_USAGE)


_LAZY = {
    "WriteSnapshot": "beam_jobs.writing.write_snapshot",
    "RunSpec": "beam_jobs.writing.commit",
    "FinalizeOutcome": "beam_jobs.writing.commit",
}

__all__ = ["FinalizeOutcome", "RunSpec", "WriteSnapshot", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'beam_jobs' has no attribute {name!r}")
