"""The DirectRunner: the mode a job runs by default, and multi_threading without Beam's periodic data flush.

``apply_defaults`` picks the running mode measured fastest for the input
format (docs/architecture.md §9.1) unless the flags choose one; every mode is
correct once ``disable_periodic_data_flush`` has run, for the reason below.

In ``--direct_running_mode=multi_threading`` the DirectRunner runs the SDK
harness in-process and exchanges every stage's data with it over gRPC. Beam
(2.77) gives those streams a 1-second periodic flush
(``worker_handlers.DATA_BUFFER_TIME_LIMIT_MS``; the embedded harness cannot
turn it off, a configured 0 falls back to it). The flush runs on a thread of
its own and is not synchronized with the thread encoding elements into the
stream (``TimeBasedBufferingClosableOutputStream``: flushes take a lock,
writes do not). An element is encoded in several writes (the windowed value's
header, then its value), and when the value's coder runs Python code the
flushing thread can take the GIL in between: the header ends one chunk and
the value starts the next. The runner deals a stage's chunks out round-robin
to the next stage's workers (``ListBuffer.partition``), so the two halves
usually reach different bundles, which cannot decode them.

A CSV read without a schema hits this once its first stage runs for more than
a second: tfx-bsl batches ``(cells, raw line)`` tuples across a stage boundary
(the column types are inferred first), and the raw line's ``StrUtf8Coder`` is a
Python-level coder. At 2,000,000 rows, chunks received by the runner began
with a value's length prefix where a windowed value's header belongs (3 to 8
of about 90 chunks per run), and the next stage failed with ``Invalid
PaneInfoEncoding``, a ``MemoryError`` (a length read from the wrong bytes) or
a segmentation fault (Beam's ``InputStream`` reads without bounds checks) in
``ref_PCollection_..._20/Read``; runs passed only when both halves happened to
go to one worker. Neither snapfeed's batches nor its DoFns take part: the
corrupted PCollection is tfx-bsl's, before the first RecordBatch exists.

With the periodic flush off, streams flush by size (10 MB) and at the end of a
bundle, always between whole elements, as in_memory and multi_processing
workers do. It exists for streaming latency, which a batch job does not need.
"""

from __future__ import annotations

import logging
import os

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

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
        _LOGGER.warning(
            "apache_beam has no worker_handlers.DATA_BUFFER_TIME_LIMIT_MS: check that "
            "--direct_running_mode=multi_threading is safe with this Beam (beam_jobs/runners/direct_runner.py)"
        )
        return False
    worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0
    return True


#: Threads of the DirectRunner's default for TFRecord input: a core each, up to this (measured on 2 cores only).
TFRECORD_THREADS_MAX = 4


def apply_defaults(options: PipelineOptions, flags: list[str], input_format: str) -> None:
    """On the DirectRunner: the fastest mode measured for the input format, unless told otherwise.

    Every mode is correct once ``WriteSnapshot`` turns off Beam's periodic data
    flush (``disable_periodic_data_flush``); which is fastest depends on how
    much of the input's decode releases the GIL (docs/architecture.md §9.1).
    TFRecord input (tfx-bsl's decoder releases it) defaults to multi_threading
    with a thread per core (at most ``TFRECORD_THREADS_MAX``), CSV and Parquet
    to Beam's own in_memory: no gRPC between stages, and no worker process that
    must import the function afresh. --direct_num_workers alone asks for that
    many threads.
    """
    if (options.view_as(StandardOptions).runner or "DirectRunner") != "DirectRunner":
        return
    given = {flag.split("=", 1)[0].removeprefix("--") for flag in flags if flag.startswith("--")}
    if "direct_running_mode" in given:
        return
    direct = options.view_as(DirectOptions)
    if "direct_num_workers" in given:
        direct.direct_running_mode = "multi_threading"
    elif input_format == "tfrecord":
        direct.direct_running_mode = "multi_threading"
        direct.direct_num_workers = max(2, min(os.cpu_count() or 1, TFRECORD_THREADS_MAX))
    else:
        direct.direct_running_mode = "in_memory"
