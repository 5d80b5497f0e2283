"""PyTorch: the reader as an ``IterableDataset`` (imported only when asked for).

Batching, shuffling and rebatching happen in the reader, so use it with
``DataLoader(ds, batch_size=None)``. With ``num_workers=k`` each loader worker
becomes one more input pipeline of the same job: it reads a disjoint part of
the snapshot and yields full global batches, so every row still arrives once
per epoch and the loader interleaves the workers' steps.

Steps a loader worker yields reach the training process in the worker's
reused shared-memory slots (``reader.outputs.shared_steps``), not pickled tensor by
tensor. A ``collate_fn`` runs in the worker on those slot handles, which
refuse to be read with one error saying so: leave it out (with
``batch_size=None`` the reader's steps need none) and transform in ``map_fn``,
which runs in the workers before the step goes into its slot.

Inside a ``torch.distributed`` group (DDP) the dataset reads as pipeline rank
of world size (``reader.process_groups``), and each rank x loader worker is one
pipeline: every pipeline takes the same number of steps, so ranks do too.

Epochs: each iteration advances the epoch (a fresh shuffle each time) of the
process it runs in: this one, or a persistent loader worker (each worker
advances its own, all alike). With ``num_workers > 0`` and no
``persistent_workers`` the loader copies this object into new workers every
epoch, so their counters never come back: call ``set_epoch(e)`` before each
epoch, as with ``DistributedSampler``. ``set_epoch`` reaches persistent workers
too, started before or after it (``_EpochRequest``).

Resuming: ``dataset.loader(num_workers=k, ...)`` is a ``DataLoader`` whose
``state_dict()`` is the position of the steps the training loop received, not
of those its workers prefetched: each worker's state after a step travels with
the step, and ``reader.outputs.loader_state`` makes one state of them. A plain
``DataLoader`` cannot have one: its main process calls nothing of the dataset
while workers run it ahead. ``load_state_dict()`` makes the next iteration
resume there, also with another world size or ``num_workers`` (elastic).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import multiprocessing
import multiprocessing.context
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch.utils.data

from reader.core.allocator import BatchAllocator, new_batch
from reader.core.iterator import ReaderIterator
from reader.core.mixture_pipeline import open_pipeline
from reader.core.options import ReaderOptions
from reader.core.pipeline import ReadPipeline
from reader.core.plan import InputContext
from reader.core.union import Readable
from reader.outputs.adapters import step_adapter
from reader.outputs.loader_state import loader_state
from reader.outputs.shared_steps import WorkerRing, slots_for
from schemas.errors import UsageError


def _per_loader_worker(options: ReaderOptions, worker: int, workers: int) -> ReaderOptions:
    context = options.context
    return dataclasses.replace(
        options,
        global_batch_size=options.global_batch_size * workers,
        context=InputContext(
            num_input_pipelines=context.num_input_pipelines * workers,
            input_pipeline_id=context.input_pipeline_id * workers + worker,
            num_replicas_in_sync=context.num_replicas_in_sync * workers,
        ),
    )


def _options_for(options: ReaderOptions, worker: int, workers: int) -> ReaderOptions:
    """What loader worker ``worker`` of ``workers`` reads (with one or none: the dataset's own options)."""
    return _per_loader_worker(options, worker, workers) if workers > 1 else options


class _Delivered(NamedTuple):
    """What a worker of a ``SnapshotLoader`` yields: its state after ``step`` (``step`` None: before its first),
    as JSON: DataLoader's ``default_convert`` and pin-memory thread pass a string through instead of
    rebuilding a dict per step (docs/architecture.md §9.5)."""

    worker: int
    state: str
    step: Any


def _delivered(steps: ReaderIterator, worker: int, share) -> Iterator[_Delivered]:
    yield _Delivered(worker, json.dumps(steps.get_state()), None)
    for step in steps:
        yield _Delivered(worker, json.dumps(steps.get_state()), share(step))


class _EpochRequest:
    """The last ``set_epoch``, in memory shared with loader workers (a count of calls, the epoch).

    Persistent workers keep the copy of the dataset they were started with, so
    a ``set_epoch`` made in the training process afterwards reaches them only
    through shared memory: each iteration takes the epoch asked for since the
    one before, if any. Workers get it by fork (inherited) or spawn (pickled
    while spawning); any other copy of the dataset (``copy.deepcopy``,
    ``pickle``) gets a request of its own, and so does any other process that
    is not a loader worker (DDP ranks started with the dataset), as its epochs
    are its own.
    """

    def __init__(self) -> None:
        self._shared = multiprocessing.RawArray("q", 2)
        self._seen = 0
        self.owner = os.getpid()

    def __reduce__(self):
        if multiprocessing.context.get_spawning_popen() is None:
            return _EpochRequest, ()
        return _shared_request, (self._shared, self._seen, self.owner)

    def ask(self, epoch: int) -> None:
        self._shared[1] = epoch
        self._shared[0] += 1  # after the epoch: a worker that sees the call sees its epoch

    def take(self) -> int | None:
        """The epoch asked for since the last ``take`` in this process, else None."""
        calls = self._shared[0]
        if calls == self._seen:
            return None
        self._seen = calls
        return self._shared[1]


def _shared_request(shared, seen: int, owner: int) -> _EpochRequest:
    request = _EpochRequest.__new__(_EpochRequest)
    request._shared, request._seen, request.owner = shared, seen, owner
    return request


class SnapshotIterableDataset(torch.utils.data.IterableDataset):
    def __init__(self, snapshot: Readable, options: ReaderOptions, map_fn=None) -> None:
        super().__init__()
        self._map_fn = map_fn
        self._snapshot = snapshot
        self._options = dataclasses.replace(options, output="torch")
        self._epoch = 0
        self._epoch_request = _EpochRequest()
        self._ring = None  # a loader worker's shared-memory slots (reader.outputs.shared_steps), made in the worker
        self._pipeline: ReadPipeline | None = None  # made by the first iteration in each process
        self._with_states = False  # a SnapshotLoader's copy: steps come as _Delivered
        self._resume: dict | None = None  # a state the next iteration resumes (SnapshotLoader.load_state_dict)

    def __getstate__(self) -> dict:
        """Pickled into loader workers without the pipeline (threads, open shards): each makes its own."""
        return {**self.__dict__, "_pipeline": None}

    def _pipeline_for(self, options: ReaderOptions, allocate_batch: BatchAllocator) -> ReadPipeline:
        """One pipeline kept from epoch to epoch (in-process and in persistent workers), as
        ``DistributedDataset`` does: its window cache hands buffers from one pass to the next."""
        pipeline = self._pipeline
        if pipeline is None or pipeline.options != options or pipeline.allocate_batch != allocate_batch:
            self._pipeline = open_pipeline(self._snapshot, options, allocate_batch)
        return self._pipeline

    def _epoch_request_here(self) -> _EpochRequest:
        """The request this process shares with its loader workers (made anew in any other process)."""
        if torch.utils.data.get_worker_info() is None and self._epoch_request.owner != os.getpid():
            self._epoch_request = _EpochRequest()
        return self._epoch_request

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iteration pass number ``epoch`` (its shuffle), in this process and in loader workers."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise UsageError(f"set_epoch({epoch!r}); give a non-negative integer")
        self._epoch = epoch * (self._options.num_epochs or 1)
        self._epoch_request_here().ask(self._epoch)

    def loader(self, **kwargs) -> SnapshotLoader:
        """A ``DataLoader`` of these steps with ``state_dict()``/``load_state_dict()`` (``SnapshotLoader``)."""
        return SnapshotLoader(self, **kwargs)

    def _steps(self, options: ReaderOptions, first_epoch: int, allocate_batch: BatchAllocator) -> ReaderIterator:
        pipeline = self._pipeline_for(options, allocate_batch)
        spec = {name: self._snapshot.element_spec[name] for name in pipeline.columns}
        return ReaderIterator(pipeline, first_epoch, step_adapter("torch", spec, self._map_fn))

    def _resumed(self, steps: ReaderIterator, state: dict) -> None:
        """``steps`` at ``state``; the next iteration starts after the epochs this one ends."""
        steps.set_state(state)
        if state["stop_epoch"] is not None:
            self._epoch = state["stop_epoch"]

    def _checked_resume(self, state: dict, workers: int) -> dict:
        """``state`` as the next iteration resumes it, refused here (one line) if it does not fit this dataset:
        a state saved after an iteration's last step resumes with the next epoch, not an empty iteration."""
        epochs, stop = self._options.num_epochs, isinstance(state, dict) and state.get("stop_epoch")
        if epochs is not None and type(stop) is int and (state.get("finished") or state.get("epoch") == stop):
            state = {**state, "finished": False, "stop_epoch": stop + epochs}
        self._resumed(self._steps(_options_for(self._options, 0, workers), self._epoch, new_batch), state)
        return state

    def _state_before(self, workers: int) -> dict:
        """The state of a next iteration that resumes nothing (its first worker's)."""
        return self._steps(_options_for(self._options, 0, workers), self._epoch, new_batch).get_state()

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        options = self._options
        if info is not None:
            options = _options_for(options, info.id, info.num_workers)
        if (requested := self._epoch_request_here().take()) is not None:
            self._epoch = requested
        first_epoch = self._epoch
        self._epoch += options.num_epochs or 0
        in_slots = info is not None and WorkerRing.available()
        if in_slots and self._ring is None:
            self._ring = WorkerRing(slots_for(options.read.prefetch))
        steps = self._steps(options, first_epoch, self._ring.allocate if in_slots else new_batch)
        resume, self._resume = self._resume, None
        if resume is not None:
            self._resumed(steps, resume)
        if self._with_states:
            return _delivered(steps, 0 if info is None else info.id, self._ring.share if in_slots else lambda s: s)
        return map(self._ring.share, steps) if in_slots else steps


class SnapshotLoader(torch.utils.data.DataLoader):
    """``DataLoader(dataset, batch_size=None, **kwargs)`` whose ``state_dict()`` says where the steps the
    training loop received leave the epoch; ``load_state_dict()`` makes the next iteration resume there.

    One rank's state restores every rank of a job with any world size and ``num_workers`` (each reads its
    share of the rest of the epoch once, all in the same number of steps), the unchanged job included.
    """

    def __init__(self, dataset: SnapshotIterableDataset, **kwargs) -> None:
        if not isinstance(dataset, SnapshotIterableDataset):
            raise UsageError(f"SnapshotLoader reads a dataset's to_torch(), not a {type(dataset).__name__}")
        if kwargs.get("batch_size") is not None or kwargs.get("collate_fn") is not None:
            raise UsageError(
                "dataset.loader() takes no batch_size or collate_fn: the reader's steps are batched already; "
                "transform them in distributed_dataset(map_fn=...)"
            )
        kwargs.pop("batch_size", None)
        tracked = copy.copy(dataset)  # shares set_epoch with ``dataset``; yields _Delivered
        tracked._with_states = True
        super().__init__(tracked, batch_size=None, **kwargs)
        self._states: list[str] | None = None  # each worker's state (JSON) after the last step received from it
        self._loaded: dict | None = None  # a state loaded and not iterated yet

    @property
    def _workers(self) -> int:
        return max(self.num_workers, 1)

    def __iter__(self):
        items = super().__iter__()
        self.dataset._resume = None  # the workers (or the dataset here) took it
        states = [""] * self._workers
        for _ in range(self._workers):  # every worker's state before its first step comes first
            item = next(items)
            states[item.worker] = item.state
        self._states, self._loaded = states, None
        return self._received(items)

    def _received(self, items) -> Iterator:
        for item in items:
            self._states[item.worker] = item.state
            yield item.step

    def state_dict(self) -> dict:
        """A JSON-serializable reader state: the position after the last step this loop received."""
        if self._loaded is not None:
            return self._loaded
        if self._states is None:
            return self.dataset._state_before(self._workers)
        return loader_state([json.loads(state) for state in self._states], self.dataset._snapshot.block_rows)

    def load_state_dict(self, state: dict) -> None:
        """Makes the next iteration resume at ``state`` (refused here, in one line, if it does not fit)."""
        state = self.dataset._checked_resume(state, self._workers)
        self.dataset._resume = self._loaded = state
        self._iterator = None  # persistent workers already started would not see it: new ones start
