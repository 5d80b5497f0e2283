"""Prometheus metrics of the reader service's dispatcher and workers, served over HTTP with ``--metrics_port``.

Each server has a registry of its own (tests and benchmarks run several
servers in one process; the global default registry would mix them).
The dispatcher's figures are read from its state when scraped
(``DispatcherCollector``): jobs already count their splits' leases, re-leases,
acknowledgements and expiries as events are applied (``dispatch_state.SplitTally``),
so a restarted dispatcher reports what its journal replays. A worker's are
counted as they happen (``WorkerMetrics``): its state keeps no rows or bytes.
Names and labels follow Prometheus conventions (``snapfeed_..._total``,
``_bytes``, ``_seconds``); docs/service.md "Metrics" lists them (docs/architecture.md §5.7).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator

import prometheus_client
import pyarrow as pa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from reader.core.cache import cache_counters
from reader.core.metrics_endpoint import MetricsEndpoint
from reader.service.dispatch_state import DispatchState
from reader.service.protocol import ANONYMOUS_JOB

JOB_LABELS = ["job", "processing_mode"]


def endpoint(registry: CollectorRegistry, host: str, port: int | None) -> MetricsEndpoint | None:
    """The server's metrics endpoint, or None when ``port`` is None (metrics are off by default)."""
    return None if port is None else MetricsEndpoint(registry, host, port, f"--metrics_port={port}")


@dataclasses.dataclass
class _JobFigures:
    """One job name's epochs (the dispatcher's jobs of one ``job_name`` and mode), added up."""

    epochs: int = 0
    finished: int = 0
    consumers: int = 0  # of its latest epoch
    latest: int = -1
    leased: int = 0
    released: int = 0
    delivered: int = 0
    expired: int = 0


class DispatcherCollector(Collector):
    """The dispatcher's metrics, read from ``state`` under ``lock`` (the servicer's) at each scrape.

    ``journal_bytes()``: the journal's size now; ``recovery_seconds``: how long reading and replaying it took at start.
    """

    def __init__(
        self,
        state: DispatchState,
        lock: threading.Lock,
        journal_bytes: Callable[[], int],
        recovery_seconds: float,
    ) -> None:
        self._state = state
        self._lock = lock
        self._journal_bytes = journal_bytes
        self._recovery_seconds = recovery_seconds

    def collect(self):
        with self._lock:
            workers = len(self._state.live_workers(now=time.time()))
            jobs = _per_job(self._state)
        yield GaugeMetricFamily("snapfeed_dispatcher_workers", "Live workers (heartbeat within 15 s)", value=workers)
        yield GaugeMetricFamily(
            "snapfeed_dispatcher_journal_bytes", "Size of the --work_dir journal", value=self._journal_bytes()
        )
        yield GaugeMetricFamily(
            "snapfeed_dispatcher_recovery_seconds",
            "Time this dispatcher took at start to read and replay its journal",
            value=self._recovery_seconds,
        )
        families = {
            "consumers": GaugeMetricFamily(
                "snapfeed_dispatcher_consumers", "Consumers of the job's latest epoch", labels=JOB_LABELS
            ),
            "epochs": CounterMetricFamily("snapfeed_dispatcher_epochs", "Epochs of the job started", labels=JOB_LABELS),
            "finished": CounterMetricFamily(
                "snapfeed_dispatcher_epochs_finished",
                "Epochs of the job every row of which was read",
                labels=JOB_LABELS,
            ),
            "leased": CounterMetricFamily(
                "snapfeed_dispatcher_splits_leased", "Leases granted (renewals not counted)", labels=JOB_LABELS
            ),
            "released": CounterMetricFamily(
                "snapfeed_dispatcher_splits_released",
                "Leases granted again after a lease expired (its consumer was lost)",
                labels=JOB_LABELS,
            ),
            "delivered": CounterMetricFamily(
                "snapfeed_dispatcher_splits_delivered", "Splits acknowledged: every row delivered", labels=JOB_LABELS
            ),
            "expired": CounterMetricFamily(
                "snapfeed_dispatcher_lease_expiries", "Leases that expired unrenewed", labels=JOB_LABELS
            ),
        }
        for labels, figures in sorted(jobs.items()):
            for name, family in families.items():
                family.add_metric(list(labels), getattr(figures, name))
        yield from families.values()


def _per_job(state: DispatchState) -> dict[tuple[str, str], _JobFigures]:
    """Figures per (job name, processing mode); the caller holds the dispatcher's lock."""
    jobs: dict[tuple[str, str], _JobFigures] = {}
    for job in state.jobs.values():
        name = job.key.job_name
        if name.startswith(f"{ANONYMOUS_JOB}-"):
            name = ANONYMOUS_JOB  # one series for every unnamed consumer's job, not one each
        figures = jobs.setdefault((name, job.mode), _JobFigures())
        figures.epochs += 1
        figures.finished += job.finished
        if job.key.iteration > figures.latest:
            figures.latest, figures.consumers = job.key.iteration, len(job.consumers)
        for name in ("leased", "released", "delivered", "expired"):
            setattr(figures, name, getattr(figures, name) + getattr(job.tally, name))
    return jobs


class CacheCollector(Collector):
    """A worker's shard cache counts (``reader.core.cache.shard_cache``), labelled with its address, read when scraped."""

    def __init__(self, worker: str, cache) -> None:
        self._worker, self._cache = worker, cache

    def collect(self):
        yield from cache_counters([([self._worker, str(self._cache.directory)], self._cache)], ("worker", "cache_dir"))


class WorkerMetrics:
    """A worker's metrics, labelled with its address (``worker``), counted as its streams run."""

    def __init__(self, registry: CollectorRegistry, worker: str, draining: Callable[[], bool]) -> None:
        mode_labels = ["worker", "processing_mode"]

        def counter(name: str, text: str, labels=("worker",)) -> prometheus_client.Counter:
            return prometheus_client.Counter(name, text, list(labels), registry=registry)

        self._worker = worker
        self._streams = counter("snapfeed_worker_streams", "Streams started", mode_labels)
        self._resumed = counter(
            "snapfeed_worker_streams_resumed",
            "Split streams started past the split's first row: the rest of a split a lost worker did not finish "
            "(or a restored consumer's)",
        ).labels(worker)
        self._rows = counter("snapfeed_worker_served_rows", "Rows sent to consumers", mode_labels)
        self._bytes = counter("snapfeed_worker_served_bytes", "Arrow bytes of the record batches sent", mode_labels)
        #: bytes of blocks read from shard files (a direct read: the projected columns' bytes; else whole blocks)
        self.storage_read = counter(
            "snapfeed_worker_storage_read_bytes", "Bytes of blocks read from the snapshot's shard files"
        ).labels(worker)
        self._errors = counter(
            "snapfeed_worker_stream_errors", "Streams refused or ended by an error (the consumer retries or fails)"
        ).labels(worker)

        def gauge(name: str, text: str) -> prometheus_client.Gauge:
            return prometheus_client.Gauge(name, text, ["worker"], registry=registry).labels(worker)

        self._open = gauge("snapfeed_worker_streams_open", "Streams being sent")
        gauge("snapfeed_worker_draining", "1 while the worker drains").set_function(lambda: float(draining()))

    def failed(self) -> None:
        """A stream refused before it started (a bad ticket, a snapshot refused, a draining worker)."""
        self._errors.inc()

    def served(self, mode: str, resumed: bool, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, counted as they are handed to Flight."""
        self._streams.labels(self._worker, mode).inc()
        if resumed:
            self._resumed.inc()
        rows, sent = self._rows.labels(self._worker, mode), self._bytes.labels(self._worker, mode)
        self._open.inc()
        try:
            for batch in batches:
                rows.inc(batch.num_rows)
                sent.inc(batch.get_total_buffer_size())
                yield batch
        except Exception:
            self._errors.inc()
            raise
        finally:
            self._open.dec()
