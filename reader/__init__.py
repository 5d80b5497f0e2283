"""snapfeed's reader: shuffled, sharded, rebatched batches from a finalized snapshot.

``reader`` never imports ``beam_jobs``; the snapshot contract in ``schemas/``
is all they share. TensorFlow, PyTorch and JAX are imported only when their
output is asked for.
"""

from reader.api import dataset, distributed_dataset
from reader.core.iterator import ReaderIterator
from reader.core.mixture import mixture
from reader.core.options import CacheOptions, ReadOptions
from reader.core.plan import InputContext, ShardPolicy
from reader.core.snapshot import Snapshot, TensorSpec, open_snapshot
from reader.core.stats import InputStats
from reader.dataset import DistributedDataset
from reader.outputs.placement import PlacementOptions
from reader.outputs.transform_graph import transform_features, transform_output, vocabulary
from reader.service.options import ServiceOptions
from schemas.errors import (
    CorruptSnapshotError,
    FormatVersionError,
    ServiceUnavailableError,
    SnapfeedError,
    SnapshotInProgressError,
    SnapshotNotFoundError,
    UsageError,
)

__all__ = [
    "CacheOptions",
    "CorruptSnapshotError",
    "DistributedDataset",
    "FormatVersionError",
    "InputContext",
    "InputStats",
    "ReaderIterator",
    "PlacementOptions",
    "ReadOptions",
    "ServiceOptions",
    "ServiceUnavailableError",
    "ShardPolicy",
    "SnapfeedError",
    "Snapshot",
    "SnapshotInProgressError",
    "SnapshotNotFoundError",
    "TensorSpec",
    "UsageError",
    "dataset",
    "distributed_dataset",
    "mixture",
    "open_snapshot",
    "transform_features",
    "transform_output",
    "vocabulary",
]
