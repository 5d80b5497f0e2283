"""snapfeed's Beam side: the materialize job and the ``WriteSnapshot`` transform.

Names are imported lazily (PEP 562) so that ``beam_jobs.airflow`` can be
imported at DAG-parse time without importing Apache Beam or TensorFlow.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

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
