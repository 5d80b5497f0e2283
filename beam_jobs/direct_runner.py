"""The DirectRunner's multi_threading mode without Beam's periodic data flush.

In ``--direct_running_mode=multi_threading`` the DirectRunner runs the SDK
harness in-process and talks to it over gRPC. Beam (2.77 and earlier) gives
those in-process data streams a 1-second periodic flush
(``worker_handlers.DATA_BUFFER_TIME_LIMIT_MS``, which the embedded harness
cannot turn off: a configured 0 falls back to it). The flush runs on its own
thread and is not synchronized with the thread encoding elements into the
stream (``TimeBasedBufferingClosableOutputStream``: only flushes take the lock,
writes do not), and it copies the buffer, hands it on and only then clears it.
Whenever a coder runs Python code mid-element, the flushing thread gets the
GIL inside an element: the bytes already written go out as one chunk, the
``_clear()`` drops whatever the writer added meanwhile, and the next chunk
starts inside an element.

A CSV read without a schema hits this on every run longer than a second or
so: tfx-bsl batches ``(cells, raw line)`` tuples across a stage boundary (the
column types are inferred first), and the raw line's ``StrUtf8Coder`` is a
Python-level coder. Observed at 2,000,000 rows: chunks starting with a value's
length prefix where a windowed value's header belongs, then ``Invalid
PaneInfoEncoding``, ``MemoryError`` (a length read from the wrong bytes) or a
segmentation fault in ``ref_PCollection_.../Read`` (Beam's InputStream does
no bounds checks), and whole elements silently dropped when the drop fell on
element boundaries.

With the periodic flush off, streams flush by size (10 MB) and when a bundle
ends, always between whole elements: what in_memory and multi_processing
workers do. The flag is for streaming latency, which a batch job does not
need.
"""

from __future__ import annotations

import logging

_LOGGER = logging.getLogger(__name__)


def disable_periodic_data_flush() -> bool:
    """Turns Beam's periodic flush of in-process gRPC data streams off; False if this Beam has no such setting.

    Process-wide, and read when a pipeline starts its worker handlers, so it
    must run before ``pipeline.run()``; pipelines already running keep theirs.
    """
    try:
        from apache_beam.runners.portability.fn_api_runner import worker_handlers
    except ImportError:
        return False
    if not isinstance(getattr(worker_handlers, "DATA_BUFFER_TIME_LIMIT_MS", None), int):
        _LOGGER.warning("apache_beam has no worker_handlers.DATA_BUFFER_TIME_LIMIT_MS; multi_threading is not used")
        return False
    worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0
    return True
