"""The consumer side of the reader service, behind ``reader.distributed_dataset(service=...)``.

How an epoch is read is in ``epoch_reads`` (distributed_epoch: leased
splits, each delivered exactly once, also across worker failures;
parallel_epochs: every worker's whole stream), the connections in
``connection`` and ``worker_clients``.

Rows are then batched and split across replicas exactly as the local reader
does; ``DistributedDataset`` supplies the adapters, ``tf.distribute`` and Keras.
Iterators resume with ``get_state``/``set_state``: the state names this
consumer and how many rows of each split (or worker stream) it delivered, and
the dispatcher re-leases a restored consumer's assignments by index.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Callable, Iterator

from reader import allocator
from reader.blocks import Columns
from reader.dataset import DistributedDataset
from reader.options import PlacementOptions, ReaderOptions
from reader.plan import InputContext, replica_ranges
from reader.service.connection import ServiceConnection, ServiceUnavailableError
from reader.service.delivery import DeliveryBatcher
from reader.service.epoch_reads import Cursor, epoch_batches
from reader.service.worker_clients import WorkerClients
from reader.snapshot import Snapshot
from schemas import paths
from schemas.errors import UsageError
from schemas.service_pb2 import JobRequest

STATE_VERSION = 1

__all__ = ["ServiceConnection", "ServiceDataset", "ServiceIterator", "ServiceUnavailableError"]


class ServiceDataset(DistributedDataset):
    """Iterating yields steps like ``DistributedDataset``: a batch per local replica."""

    def __init__(
        self,
        snapshot: Snapshot,
        options: ReaderOptions,
        connection: ServiceConnection,
        *,
        strategy=None,
        map_fn: Callable | None = None,
        placement: PlacementOptions | None = None,
    ) -> None:
        self._connection = connection
        # One job name for every iterator and restore of this dataset (and its tf.distribute pipelines).
        self._job_name = connection.job_name or f"anonymous-{uuid.uuid4().hex}"
        self._seed = options.seed if options.seed is not None else int(uuid.uuid4().int % (2**62))
        super().__init__(snapshot, options, strategy, map_fn, placement)

    def _local_pipeline(self) -> None:
        names = [c.name for c in self.snapshot.metadata.columns]
        if unknown := [c for c in self.options.columns or () if c not in names]:
            raise UsageError(f"unknown columns {unknown}; {self.snapshot.path} has {names}")
        return None

    @property
    def columns(self) -> list[str]:
        return list(self.options.columns) if self.options.columns else [c.name for c in self.snapshot.metadata.columns]

    @property
    def steps_per_epoch(self) -> None:
        """None: no count is right before an epoch is read, and a wrong one breaks ``as_tf_dataset``'s cardinality.

        distributed_epoch: consumers sharing a job split its rows first come,
        first served, so a consumer's steps depend on which splits it wins
        (the whole job is ``ceil(num_rows / per-pipeline batch)`` steps only
        when it reads alone). parallel_epochs: every worker streams the whole
        snapshot, so an epoch is ``ceil(workers * num_rows / per-pipeline
        batch)`` steps for the workers live when the epoch starts, which may
        change from epoch to epoch. Give Keras ``steps_per_epoch`` yourself
        where you know them, or iterate until the epoch ends.
        """
        return None

    def _iterator(self, first_epoch: int, adapt: Callable[[list], object]) -> ServiceIterator:
        return ServiceIterator(self, first_epoch, adapt)

    def _for_context(self, context: InputContext) -> ServiceDataset:
        per_pipeline = ServiceDataset(
            self.snapshot,
            dataclasses.replace(self.options, context=context, seed=self._seed),
            self._connection,
            map_fn=self._map_fn,
        )
        per_pipeline._job_name = self._job_name
        return per_pipeline

    def to_torch(self):
        raise UsageError("to_torch() reads locally; with service= iterate the dataset (output='torch') instead")


class ServiceIterator:
    """Steps of a service job; ``get_state()``/``set_state()`` resume exactly (JSON-serializable)."""

    def __init__(self, dataset: ServiceDataset, first_epoch: int, adapt: Callable[[list], object]) -> None:
        allocator.keep_freed_batches()  # batches are fresh arrays here too
        self._dataset = dataset
        self._connection = dataset._connection
        self._adapt = adapt
        epochs = dataset.options.num_epochs
        self._stop_epoch = None if epochs is None else first_epoch + epochs
        self._cursor = Cursor.fresh(first_epoch, dataset._job_name)
        self._steps: Iterator[list[Columns]] | None = None
        self._finished = False
        self._workers = WorkerClients(
            dataset._connection, _sent_path(dataset.snapshot), dataset.snapshot.metadata.run_id, dataset.columns
        )

    def __iter__(self) -> ServiceIterator:
        return self

    def __next__(self):
        while not self._finished:
            if self._steps is None:
                self._steps = self._epoch_steps(self._cursor)
            try:
                return self._adapt(next(self._steps))
            except StopIteration:
                self._steps = None
                self._cursor = Cursor.fresh(self._cursor.epoch + 1, self._dataset._job_name)
                self._finished = self._stop_epoch is not None and self._cursor.epoch >= self._stop_epoch
        self.close()
        raise StopIteration

    # -- state ---------------------------------------------------------------------------------
    def _config(self) -> str:
        d = self._dataset
        o = d.options
        shape = {
            "snapshot": [d.snapshot.snapshot_id, d.snapshot.metadata.run_id],
            "batch": o.global_batch_size,
            "context": [o.context.num_input_pipelines, o.context.input_pipeline_id, o.context.num_replicas_in_sync],
            "drop_remainder": o.drop_remainder,
            "columns": d.columns,
            "mode": self._connection.mode,
        }
        return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]

    def get_state(self) -> dict:
        cursor = self._cursor
        return {
            "version": STATE_VERSION,
            "service": True,
            "config": self._config(),
            "job_name": self._dataset._job_name,
            "seed": self._dataset._seed,
            "epoch": cursor.epoch,
            "consumer": cursor.consumer,
            "next_index": cursor.next_index,
            "held": [[source, rows] for source, rows in cursor.held.items()],
            "stop_epoch": self._stop_epoch,
            "finished": self._finished,
        }

    def set_state(self, state: dict) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION or not state.get("service"):
            raise UsageError(f"not a snapfeed reader-service state (version {STATE_VERSION}): {state!r:.200}")
        if state["config"] != self._config():
            raise UsageError(
                "this state was saved by a service reader over another snapshot or with other options "
                "(batch size, replicas, columns, processing_mode); build the dataset with the same arguments"
            )
        self.close()
        self._dataset._job_name = state["job_name"]
        self._dataset._seed = int(state["seed"])
        self._cursor = Cursor(
            int(state["epoch"]), state["consumer"], int(state["next_index"]), {s: int(r) for s, r in state["held"]}
        )
        self._stop_epoch = state["stop_epoch"]
        self._finished = bool(state["finished"])

    def close(self) -> None:
        """Stops reading (idempotent). Leases are kept until they expire, so a restore can re-claim them."""
        if self._steps is not None:
            self._steps.close()
            self._steps = None
        self._workers.close()

    def __del__(self) -> None:
        self.close()

    # -- one epoch -------------------------------------------------------------------------------
    def _epoch_steps(self, cursor: Cursor) -> Iterator[list[Columns]]:
        d = self._dataset
        context = d.options.context
        batcher = DeliveryBatcher(
            d.options.global_batch_size // context.num_input_pipelines, drop_remainder=d.options.drop_remainder
        )

        def step(batch: Columns) -> list[Columns]:
            rows = len(next(iter(batch.values())))
            return [
                {n: v[lo:hi] for n, v in batch.items()}
                for lo, hi in replica_ranges(rows, context.replicas_per_pipeline)
            ]

        request = JobRequest(
            job_name=d._job_name,
            iteration=cursor.epoch,
            snapshot=_sent_path(d.snapshot),
            run_id=d.snapshot.metadata.run_id,
            processing_mode=self._connection.mode,
            consumer=cursor.consumer,
            seed=d._seed,
        )
        for batch in epoch_batches(self._connection, self._workers, d.snapshot.block_rows, request, cursor, batcher):
            yield step(batch)


def _sent_path(snapshot: Snapshot) -> str:
    """The snapshot as servers are told it: absolute (they resolve paths against their own directory)."""
    return paths.absolute(snapshot.path)
