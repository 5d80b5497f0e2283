"""``DistributedDataset``: a source's host steps as the consumer gets them.

Whatever the source (``reader.source``: the local reader, or the reader
service's client), steps go to the same outputs: our resumable iterator
(NumPy, torch, JAX, eager TF), placed on devices ahead of the consumer, a
``tf.data.Dataset`` of per-replica batches, or a ``tf.distribute``
distributed dataset built from it for Keras. The entry points that build a
dataset are in ``reader.api``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from reader.core.plan import InputContext
from reader.core.snapshot import TensorSpec
from reader.core.state import LOCAL
from reader.core.stats import MeasuredIterator, StepClock, sized
from reader.outputs.adapters import batch_adapter, step_adapter, tf_signature
from reader.outputs.device_prefetch import DevicePrefetcher
from reader.outputs.placement import PlacementOptions
from reader.outputs.step_ledger import StepLedger
from reader.source import StepSource
from schemas import extras
from schemas.errors import UsageError


class EpochCounter:
    """Each new iteration of a dataset starts after the epochs of the previous one (fresh shuffles)."""

    def __init__(self, num_epochs: int | None) -> None:
        self._num_epochs = num_epochs
        self._next = 0

    def next_first_epoch(self) -> int:
        first = self._next
        self._next += self._num_epochs or 0
        return first

    def resume_at(self, epoch: int | None) -> None:
        """An iteration was restored to a state whose last epoch is before ``epoch``: the next one starts there."""
        if epoch is not None:
            self._next = epoch


class DistributedDataset:
    """Iterating yields one step: a batch per local replica (PerReplica values with a strategy).

    Steps come from ``source`` (``reader.source.StepSource``: the local reader
    or the reader service); per-replica output, adapters, placement,
    ``tf.distribute`` and Keras support are the same for every source.
    """

    def __init__(
        self,
        source: StepSource,
        strategy=None,
        map_fn: Callable | None = None,
        placement: PlacementOptions | None = None,
        metrics=None,
        ledger: StepLedger | None = None,
    ) -> None:
        """``metrics``: a ``prometheus_client`` registry or a port where every iterator's ``stats()`` are counted
        (``reader.metrics``). ``ledger``: where the TF output's steps record their position (``tf_steps``,
        ``backup_and_restore``); the one of the dataset that built this worker's under ``tf.distribute``."""
        self.snapshot = source.snapshot
        self.options = source.options
        self._source = source
        self._strategy = strategy
        self._map_fn = map_fn
        self._placement = placement or PlacementOptions()
        self._epochs = EpochCounter(self.options.num_epochs)
        self._distributed = None
        self._worker_datasets: list[DistributedDataset] = []  # what tf.distribute's dataset_fn built here
        self._ledger = ledger or StepLedger()
        self._metrics = None
        self.metrics_address: str | None = None  # host:port where metrics=<port> serves them
        if metrics is not None:
            from reader.metrics import measured_by

            self._metrics, self.metrics_address = measured_by(metrics)
        if self._placement.sharding is not None:  # a sharding that cannot hold the steps is refused before reading
            from reader.outputs.jax_output import check_sharding

            check_sharding(self._column_specs, self.options, self._placement.sharding)

    @property
    def source(self) -> StepSource:
        """Where the steps come from (``reader.source``): its ``iterator`` gives host steps before placement."""
        return self._source

    @property
    def columns(self) -> list[str]:
        return self._source.columns

    @property
    def replicas(self) -> int:
        """Replicas fed by this input pipeline."""
        return self.options.context.replicas_per_pipeline

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps of an epoch; with a strategy, those of the input pipelines tf.distribute gave this worker
        (with FILE sharding several workers can take more steps than one pipeline reading every row).
        With ``service=``: the whole job's steps in distributed_epoch (this consumer's only when it reads
        alone), None in parallel_epochs; ``reader.service.client.ServiceSource.steps_per_epoch`` says why."""
        first = self._first_pipeline
        return self._source.steps_per_epoch if first is self else first.steps_per_epoch

    @property
    def _first_pipeline(self) -> DistributedDataset:
        """This worker's first input pipeline: with a strategy, the dataset its ``dataset_fn`` built, else this."""
        if self._strategy is not None:
            self._tf_distributed()  # tf.distribute calls dataset_fn with this worker's input contexts
            if self._worker_datasets:  # (not yet with ParameterServerStrategy: it builds them later)
                return self._worker_datasets[0]
        return self

    def steps_left_in_epoch(self, state: dict) -> int:
        """Steps this pipeline takes in the epoch a restore of ``state`` (a local reader state) resumes into:
        ``steps_per_epoch`` less those taken, or, restored on another topology, the steps of the rest of the
        epoch cut for this one (``reader.core.elastic``). Keras's ``fit`` needs it for that epoch (its
        ``steps_per_epoch`` is one number); ``backup_and_restore`` uses it.

        Args:
            state: a local reader's ``get_state()``.
        """
        first = self._first_pipeline
        iterator = first._source.iterator(0, list)
        iterator.set_state(state)  # a wrong state is refused here, in one line
        restored = iterator.get_state()
        if restored.get("kind") != LOCAL:
            raise UsageError("steps_left_in_epoch() counts the steps of a local reader state, not a service one")
        return iterator.steps_left_in_epoch()

    def tf_steps(self):
        """The steps of ``tf_dataset`` for a custom training loop, their position checkpointable with
        ``tf.train.Checkpoint(data=...)`` (``reader.outputs.tf_steps``)."""
        from reader.outputs.tf_steps import TFSteps

        return TFSteps(self)

    def backup_and_restore(self, backup_dir: str, **options):
        """A ``keras.callbacks.BackupAndRestore`` that also backs up and restores this dataset's position, so
        ``fit`` resumes mid-epoch with the rows not yet trained on (``reader.outputs.keras_resume``).

        Args:
            backup_dir: where Keras keeps its backup, and this dataset its position beside it.
            **options: ``BackupAndRestore``'s own (``save_freq``, ``delete_checkpoint``...).
        """
        from reader.outputs.keras_resume import BackupAndRestore

        return BackupAndRestore(self, backup_dir, **options)

    def _restore_tf_position(self, state: dict) -> None:
        """The next iteration of the TF output resumes at ``state``, refused in one line if it is not one of ours;
        a state saved after an iteration's last step: the next iteration is the one after it."""
        self._first_pipeline._source.iterator(0, list).set_state(state)
        stop_epoch = state.get("stop_epoch")
        if stop_epoch is not None and state["epoch"] >= stop_epoch:
            for pipeline in self._worker_datasets or [self]:
                pipeline._epochs.resume_at(stop_epoch)
            self._ledger.restore(None)
        else:
            self._ledger.restore(state)

    def _restored_iteration_steps(self) -> int | None:
        """Steps of the next TF iteration when it resumes a restored state and ends (None: not restored, or
        endless): fewer than its tf.data cardinality, so a loop must stop there rather than ask tf.data for more."""
        state = self._ledger.pending
        if state is None or self.options.num_epochs is None:
            return None
        epochs_after = state["stop_epoch"] - state["epoch"] - 1
        return self.steps_left_in_epoch(state) + epochs_after * self.steps_per_epoch

    @property
    def _tf_ledger(self) -> StepLedger:
        """Where the TF output's steps record their states (from now on)."""
        self._ledger.active = True
        return self._ledger

    @property
    def _column_specs(self) -> dict[str, TensorSpec]:
        return {name: self.snapshot.element_spec[name] for name in self.columns}

    @property
    def element_spec(self):
        if self._strategy is not None:
            return self._tf_distributed().element_spec
        if self._placement.sharding is not None:
            from reader.outputs.jax_output import step_spec

            return step_spec(self._column_specs, self.options)
        spec = self._column_specs
        if self.options.output == "tf":
            spec = tf_signature(spec)
        return spec if self.replicas == 1 else [spec] * self.replicas

    def as_tf_dataset(self):
        """A ``tf.data.Dataset`` yielding the per-replica batches of each step one after another."""
        tf = extras.require("tensorflow", "a tf.data.Dataset of a snapshot (tf_dataset, as_tf_dataset)")

        signature = tf_signature(self._column_specs)
        if not signature:
            raise UsageError(
                f"{self.snapshot.path} has no columns (an empty snapshot, committed with --allow_empty): "
                f"tf.data cannot yield elements without tensors. Check snapshot.metadata.num_rows before reading."
            )
        convert = batch_adapter("tf", self._column_specs)

        def generate():  # its epochs follow the dataset's other iterations': a service job's epochs are read once
            steps = self._source.iterator(self._epochs.next_first_epoch(), list)
            restored, stream = self._ledger.start(steps, self.options.context.input_pipeline_id)
            if restored is not None:
                self._epochs.resume_at(restored.get("stop_epoch"))
            for batches in steps:
                if stream is not None:
                    self._ledger.produced(stream, steps)
                yield from map(convert, batches)

        dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
        if self.options.num_epochs is not None and self._source.exact_steps:
            elements = self.steps_per_epoch * self.replicas * self.options.num_epochs
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(elements))
        return dataset if self._map_fn is None else dataset.map(self._map_fn)

    def _tf_distributed(self):
        if self._distributed is None:

            def dataset_fn(context):
                local = DistributedDataset(
                    self._source.for_context(InputContext.coerce(context)), map_fn=self._map_fn, ledger=self._ledger
                )
                self._worker_datasets.append(local)
                return local.as_tf_dataset()

            distributed = self._strategy.distribute_datasets_from_function(
                dataset_fn, options=self._placement.input_options
            )
            self._distributed = _cardinality_in_steps(distributed, [local.replicas for local in self._worker_datasets])
        return self._distributed

    @property
    def tf_dataset(self):
        """For Keras ``model.fit``: the ``tf.distribute`` distributed dataset with a strategy, else a
        ``tf.data.Dataset`` of per-replica batches in turn (what ``reader.dataset`` returns)."""
        if self._strategy is not None:
            return self._tf_distributed()
        return self.as_tf_dataset()

    def _convert_step(self) -> Callable[[list], object]:
        """Host batches of one step to what the consumer gets: global arrays with a JAX sharding,
        tensors on a torch device, else the output's per-replica batches."""
        placement = self._placement
        if placement.sharding is not None:
            from reader.outputs.jax_output import sharded_step_adapter

            return sharded_step_adapter(self._column_specs, self.options, placement.sharding, self._map_fn)
        if placement.device is not None:
            from reader.outputs.torch_output import device_step_adapter

            return device_step_adapter(self._column_specs, placement.device, self._map_fn)
        return step_adapter(self.options.output, self._column_specs, self._map_fn)

    def __iter__(self):
        if self._strategy is not None:
            return iter(self._tf_distributed())
        first_epoch = self._epochs.next_first_epoch()
        sizes: collections.deque = collections.deque()
        clock = StepClock()
        if self._metrics is not None:
            self._metrics.count(self.snapshot.snapshot_id, clock)
        convert = sized(self._convert_step(), sizes, clock.reader)
        if not self._placement.prefetch_to_device:
            return MeasuredIterator(self._source.iterator(first_epoch, convert, clock.reader), sizes, clock)
        steps = DevicePrefetcher(
            self._source.iterator(first_epoch, list, clock.reader),
            convert,
            self._placement.prefetch_to_device,
            _delivery(convert),
        )
        return MeasuredIterator(steps, sizes, clock)

    def to_torch(self):
        """A ``torch.utils.data.IterableDataset`` of steps; use ``DataLoader(ds, batch_size=None)``."""
        extras.require("torch", "to_torch()")
        if self._placement.device is not None or self._placement.prefetch_to_device:
            raise UsageError(
                "to_torch() feeds a DataLoader, whose workers cannot place tensors on a device: iterate the "
                "dataset itself for device=/prefetch_to_device=, or use DataLoader(..., pin_memory=True) and "
                "move each step with .to(device, non_blocking=True)"
            )

        return self._source.to_torch(self._map_fn)


def _delivery(convert) -> Callable:
    """What the consumer's thread does as a prefetched step is handed over (``convert.deliver`` if it has one)."""
    return getattr(convert, "deliver", lambda step: step)


def _cardinality_in_steps(distributed, local_replicas: list[int]):
    """The distributed dataset, its ``cardinality`` counted in steps, as Keras reads it.

    tf.distribute gives a distributed dataset the cardinality of a worker's
    tf.data dataset, which yields a batch per local replica per step: with two
    replicas Keras's ``fit`` would show twice the steps, run out half way
    through the epoch and warn "Your input ran out of data". Nothing else
    reads the value but the iterator, which only tells infinite and empty
    datasets apart, so dividing it is safe. ``local_replicas``: what
    ``dataset_fn`` fed on this worker (empty when the strategy builds the
    datasets later, e.g. ParameterServerStrategy).
    """
    if local_replicas and local_replicas[0] > 1 and distributed.cardinality >= 0:
        distributed._cardinality = distributed.cardinality // local_replicas[0]
    return distributed
