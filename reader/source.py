"""Where a dataset's steps come from: the ``StepSource`` interface and the local reader's ``LocalSource``.

``DistributedDataset`` (``reader.dataset``) turns host steps into what the
consumer gets (adapters, placement, ``tf.distribute``, Keras) and asks its
source only for what this interface names, so it reads the same whether the
rows come from this process's ``ReadPipeline`` or from the reader service's
workers (``reader.service.client.ServiceSource``). The core never imports the
service: ``reader.api`` picks the source.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from reader.core.iterator import ReaderIterator
from reader.core.mixture_pipeline import open_pipeline
from reader.core.options import ReaderOptions
from reader.core.plan import InputContext
from reader.core.stats import ReaderClock
from reader.core.union import Readable
from reader.outputs.device_prefetch import StepIterator


class StepSource(Protocol):
    """What a dataset needs from where its steps come from.

    A host step is a list of per-replica dicts of NumPy arrays (``options.context``
    says how many replicas); the iterator hands each to ``adapt`` on the
    consumer's thread and resumes with ``get_state``/``set_state``.
    """

    snapshot: Readable
    options: ReaderOptions

    @property
    def columns(self) -> list[str]: ...

    @property
    def steps_per_epoch(self) -> int | None: ...

    @property
    def exact_steps(self) -> bool:
        """Whether every epoch through this pipeline is exactly ``steps_per_epoch`` steps (tf.data is then told
        its cardinality); the service's shared jobs give a job-wide count that no one consumer takes alone."""
        ...

    def iterator(
        self, first_epoch: int, adapt: Callable[[list], Any], clock: ReaderClock | None = None
    ) -> StepIterator:
        """Adapted steps from ``first_epoch`` for ``options.num_epochs`` epochs (None: forever), the reader's
        time counted in ``clock`` (``iterator.stats()``)."""
        ...

    def for_context(self, context: InputContext) -> StepSource:
        """This source as one input pipeline of a ``tf.distribute`` job sees it."""
        ...

    def to_torch(self, map_fn: Callable | None):
        """A ``torch.utils.data.IterableDataset`` of this source's steps, or a UsageError saying why not."""
        ...


class LocalSource:
    """Steps read in this process by a ``ReadPipeline`` (kept for the dataset's life: its window cache
    hands buffers from one pass to the next)."""

    def __init__(self, snapshot: Readable, options: ReaderOptions) -> None:
        self.snapshot = snapshot
        self.options = options
        self._pipeline = open_pipeline(snapshot, options)

    @property
    def columns(self) -> list[str]:
        return self._pipeline.columns

    @property
    def steps_per_epoch(self) -> int:
        return self._pipeline.steps_per_epoch

    @property
    def exact_steps(self) -> bool:
        return True

    def iterator(
        self, first_epoch: int, adapt: Callable[[list], Any], clock: ReaderClock | None = None
    ) -> ReaderIterator:
        return ReaderIterator(self._pipeline, first_epoch, adapt, clock)

    def for_context(self, context: InputContext) -> LocalSource:
        return LocalSource(self.snapshot, dataclasses.replace(self.options, context=context))

    def to_torch(self, map_fn: Callable | None):
        from reader.outputs.torch_dataset import SnapshotIterableDataset

        return SnapshotIterableDataset(self.snapshot, self.options, map_fn)
