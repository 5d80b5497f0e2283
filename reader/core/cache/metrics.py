"""A shard cache's counts (``reader.core.cache.shard_cache``) as Prometheus counter families.

Served by a reader's ``metrics=`` (``reader.metrics``, by cache directory) and
by a service worker with ``--cache_dir`` (``reader.service.metrics``, by worker too).
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.core import CounterMetricFamily

from reader.core.cache import shard_cache


def cache_counters(caches, labels: Sequence[str] = ("cache_dir",)):
    """The counts of shard caches (``reader.core.cache.shard_cache``) as two counter families: ``caches`` yields
    (``labels``' values, cache) pairs (a reader's by directory, a service worker's by worker too)."""
    shards = CounterMetricFamily(
        "snapfeed_cache_shards",
        "Bucket shards opened through the local shard cache, by outcome: entry (read from disk), "
        "download (downloaded into the cache), joined (read while another process downloaded it), bucket (read "
        "without it: the cache failed or had no room).",
        labels=[*labels, "outcome"],
    )
    downloaded = CounterMetricFamily(
        "snapfeed_cache_downloaded_bytes", "Bytes of shards downloaded into the local shard cache.", labels=labels
    )
    for values, cache in caches:
        counts = cache.counts()
        for outcome in shard_cache.OUTCOMES:
            shards.add_metric([*values, outcome], counts[outcome])
        downloaded.add_metric(values, counts["downloaded_bytes"])
    yield shards
    yield downloaded
