"""``iterator.stats()`` as Prometheus metrics, for a trainer's dashboards (``distributed_dataset(metrics=...)``).

A dataset given ``metrics=`` hands the ``StepClock`` of every iterator it makes
to the ``InputMetrics`` collector of that registry, which sums them at scrape
time: counters stay monotonic across epochs and restarts of the iterator, and
nothing is done per step beyond what ``iterator.stats()`` already counts. The
clocks are kept, not the iterators, so an iterator dropped mid-epoch still
closes. Datasets over the same snapshot on one registry add up under its label.

``metrics`` is a ``prometheus_client.CollectorRegistry`` the trainer already
serves (``prometheus_client.REGISTRY`` for its default), or a port (``9100``,
``"127.0.0.1:9100"``; 0 picks one) where a registry of the reader's own is
served over HTTP (``DistributedDataset.metrics_address`` says where).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import weakref

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from reader.core.cache import cache_counters, opened_caches
from reader.core.metrics_endpoint import MetricsEndpoint
from reader.core.stats import STAGES, StepClock
from schemas.errors import UsageError

_lock = threading.Lock()
_collectors: weakref.WeakKeyDictionary[CollectorRegistry, InputMetrics] = weakref.WeakKeyDictionary()
_served: dict[tuple[str, int], tuple[CollectorRegistry, str]] = {}  # (host, port asked) -> registry, address

#: (metric name, help, the InputStats field it sums)
_COUNTERS = (
    ("snapfeed_input_steps", "Steps delivered to the training loop.", "steps"),
    ("snapfeed_input_rows", "Rows delivered to the training loop.", "rows"),
    ("snapfeed_input_bytes", "Bytes of the steps delivered to the training loop.", "bytes"),
    (
        "snapfeed_input_wait_seconds",
        "Seconds the training loop waited inside next() for its next step.",
        "wait_seconds",
    ),
    (
        "snapfeed_input_elsewhere_seconds",
        "Seconds the training loop spent between steps (the model's time).",
        "elsewhere_seconds",
    ),
)


class InputMetrics(Collector):
    """The input counters of every iterator counted on one registry, labelled by snapshot."""

    def __init__(self) -> None:
        self._clocks: list[tuple[str, StepClock]] = []
        self._lock = threading.Lock()

    def count(self, snapshot: str, clock: StepClock) -> None:
        with self._lock:
            self._clocks.append((snapshot, clock))

    def collect(self):
        with self._lock:
            clocks = list(self._clocks)
        totals: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for snapshot, clock in clocks:
            stats = clock.stats()
            totals[snapshot].update({name: getattr(stats, field) for name, _, field in _COUNTERS})
            totals[snapshot].update(dataclasses.asdict(stats.reader))
        for name, help_text, _ in _COUNTERS:
            family = CounterMetricFamily(name, help_text, labels=["snapshot"])
            for snapshot, values in totals.items():
                family.add_metric([snapshot], values[name])
            yield family
        busy = CounterMetricFamily(
            "snapfeed_reader_busy_seconds",
            "Busy seconds of the reader's own threads per stage, summed over threads (iterator.stats().reader).",
            labels=["snapshot", "stage"],
        )
        for snapshot, values in totals.items():
            for stage in STAGES:
                busy.add_metric([snapshot, stage], values[stage])
        yield busy
        yield from cache_counters(([str(cache.directory)], cache) for cache in opened_caches())


def _collector(registry: CollectorRegistry) -> InputMetrics:
    with _lock:
        if registry not in _collectors:
            _collectors[registry] = collector = InputMetrics()
            registry.register(collector)
        return _collectors[registry]


def _not_metrics(metrics) -> UsageError:
    return UsageError(
        f"metrics={metrics!r} is neither a prometheus_client CollectorRegistry nor a port: pass "
        f"metrics=9100, metrics='127.0.0.1:9100' or metrics=prometheus_client.REGISTRY"
    )


def _parse_port(metrics: int | str) -> tuple[str, int]:
    host, _, port = str(metrics).rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise _not_metrics(metrics)
    return host.strip("[]") or "0.0.0.0", int(port)


def _served_registry(metrics: int | str) -> tuple[CollectorRegistry, str]:
    """The registry served on that port (started on first use; later datasets share it), and its address."""
    host, port = _parse_port(metrics)
    with _lock:
        if (host, port) not in _served or port == 0:
            registry = CollectorRegistry()
            address = MetricsEndpoint(registry, host, port, f"metrics={metrics!r}").address
            _served[(host, port)] = registry, address
        return _served[(host, port)]


def measured_by(metrics) -> tuple[InputMetrics, str | None]:
    """Where a dataset's iterators are counted for ``metrics=`` (a registry, or a port), and the address served
    (None: the caller's registry, served by the caller)."""
    if isinstance(metrics, CollectorRegistry):
        return _collector(metrics), None
    if isinstance(metrics, bool) or not isinstance(metrics, int | str):
        raise _not_metrics(metrics)
    registry, address = _served_registry(metrics)
    return _collector(registry), address
