"""A host's local disk cache of bucket shards (docs/architecture.md §4.11): one folder, one face.

Its internals (``shard_cache``: entries, budget, eviction and the locks that
share them; ``shard_fill``: a shard read while it downloads; ``chunk_table``,
``download_queue``, ``entry_check``; ``metrics``) keep their own locking
protocol (flock plus OFD record locks), so the rest of the reader uses only
the names here (``tests/reader/test_core_imports.py`` checks it).
"""

from reader.core.cache.metrics import cache_counters
from reader.core.cache.shard_cache import Entry, ShardCache, for_options, opened_caches, resolve_dir
from reader.core.cache.shard_fill import Filling

__all__ = ["Entry", "Filling", "ShardCache", "cache_counters", "for_options", "opened_caches", "resolve_dir"]
