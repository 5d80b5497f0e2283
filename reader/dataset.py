"""The public entry points: ``distributed_dataset`` and ``dataset``.

Both open the snapshot, validate the options once, and hand a ``ReadPipeline``
to the right output: our resumable iterator (NumPy, torch, JAX, eager TF), a
``tf.data.Dataset`` of per-replica batches, or a ``tf.distribute`` distributed
dataset built from it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence

from reader import process_groups
from reader.adapters import batch_adapter, step_adapter, tf_signature
from reader.device_prefetch import DevicePrefetcher
from reader.iterator import ReaderIterator
from reader.options import AUTO, PlacementOptions, ReaderOptions
from reader.pipeline import ReadPipeline
from reader.plan import InputContext, ShardPolicy
from reader.snapshot import Snapshot, TensorSpec, open_snapshot
from schemas.errors import UsageError


def _open(root_or_snapshot, mode: str, wait_seconds: float) -> Snapshot:
    if isinstance(root_or_snapshot, Snapshot):
        return root_or_snapshot
    return open_snapshot(str(root_or_snapshot), mode=mode, wait_seconds=wait_seconds)


class EpochCounter:
    """Each new iteration of a dataset starts after the epochs of the previous one (fresh shuffles)."""

    def __init__(self, num_epochs: int | None) -> None:
        self._num_epochs = num_epochs
        self._iterations = itertools.count()

    def next_first_epoch(self) -> int:
        iteration = next(self._iterations)
        return 0 if self._num_epochs is None else iteration * self._num_epochs


class DistributedDataset:
    """Iterating yields one step: a batch per local replica (PerReplica values with a strategy).

    Steps come from the local reader here; the reader service's client
    (``reader.service.client.ServiceDataset``) replaces ``_iterator``,
    ``_for_context`` and ``steps_per_epoch`` and keeps everything else:
    per-replica output, adapters, ``tf.distribute`` and Keras support.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        options: ReaderOptions,
        strategy=None,
        map_fn: Callable | None = None,
        placement: PlacementOptions | None = None,
    ) -> None:
        self.snapshot = snapshot
        self.options = options
        self._strategy = strategy
        self._map_fn = map_fn
        self._placement = placement or PlacementOptions()
        self._epochs = EpochCounter(options.num_epochs)
        self._distributed = None
        self._worker_datasets: list[DistributedDataset] = []  # what tf.distribute's dataset_fn built here
        self._pipeline = self._local_pipeline()
        if self._placement.sharding is not None:  # a sharding that cannot hold the steps is refused before reading
            from reader.jax_output import check_sharding

            check_sharding(self._column_specs, options, self._placement.sharding)

    def _local_pipeline(self) -> ReadPipeline | None:
        return ReadPipeline(self.snapshot, self.options)

    @property
    def columns(self) -> list[str]:
        return self._pipeline.columns

    @property
    def replicas(self) -> int:
        """Replicas fed by this input pipeline."""
        return self.options.context.replicas_per_pipeline

    @property
    def steps_per_epoch(self) -> int | None:
        """Steps of an epoch; with a strategy, those of the input pipelines tf.distribute gave this worker
        (with FILE sharding several workers can take more steps than one pipeline reading every row)."""
        if self._strategy is not None:
            self._tf_distributed()  # tf.distribute calls dataset_fn with this worker's input contexts
            if self._worker_datasets:  # (not yet with ParameterServerStrategy: it builds them later)
                return self._worker_datasets[0].steps_per_epoch
        return self._pipeline.steps_per_epoch

    def _iterator(self, first_epoch: int, adapt: Callable[[list], object]):
        """An iterator of adapted steps from ``first_epoch`` (with get_state/set_state)."""
        return ReaderIterator(self._pipeline, first_epoch, adapt)

    def _for_context(self, context: InputContext) -> DistributedDataset:
        """This dataset as seen by one input pipeline of a ``tf.distribute`` job."""
        return DistributedDataset(
            self.snapshot, dataclasses.replace(self.options, context=context), map_fn=self._map_fn
        )

    @property
    def _column_specs(self) -> dict[str, TensorSpec]:
        return {name: self.snapshot.element_spec[name] for name in self.columns}

    @property
    def element_spec(self):
        if self._strategy is not None:
            return self._tf_distributed().element_spec
        if self._placement.sharding is not None:
            from reader.jax_output import step_spec

            return step_spec(self._column_specs, self.options)
        spec = self._column_specs
        if self.options.output == "tf":
            spec = tf_signature(spec)
        return spec if self.replicas == 1 else [spec] * self.replicas

    def as_tf_dataset(self):
        """A ``tf.data.Dataset`` yielding the per-replica batches of each step one after another."""
        import tensorflow as tf

        signature = tf_signature(self._column_specs)
        if not signature:
            raise UsageError(
                f"{self.snapshot.path} has no columns (an empty snapshot, committed with --allow_empty): "
                f"tf.data cannot yield elements without tensors. Check snapshot.metadata.num_rows before reading."
            )
        convert = batch_adapter("tf", self._column_specs)
        epochs = EpochCounter(self.options.num_epochs)

        def generate():
            for batches in self._iterator(epochs.next_first_epoch(), list):
                yield from map(convert, batches)

        dataset = tf.data.Dataset.from_generator(generate, output_signature=signature)
        if self.options.num_epochs is not None and self.steps_per_epoch is not None:
            elements = self.steps_per_epoch * self.replicas * self.options.num_epochs
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(elements))
        return dataset if self._map_fn is None else dataset.map(self._map_fn)

    def _tf_distributed(self):
        if self._distributed is None:

            def dataset_fn(context):
                local = self._for_context(InputContext.coerce(context))
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
            from reader.jax_output import sharded_step_adapter

            return sharded_step_adapter(self._column_specs, self.options, placement.sharding, self._map_fn)
        if placement.device is not None:
            from reader.torch_output import device_step_adapter

            return device_step_adapter(self._column_specs, placement.device, self._map_fn)
        return step_adapter(self.options.output, self._column_specs, self._map_fn)

    def __iter__(self):
        if self._strategy is not None:
            return iter(self._tf_distributed())
        first_epoch = self._epochs.next_first_epoch()
        convert = self._convert_step()
        if not self._placement.prefetch_to_device:
            return self._iterator(first_epoch, convert)
        return DevicePrefetcher(
            self._iterator(first_epoch, list), convert, self._placement.prefetch_to_device, _delivery(convert)
        )

    def to_torch(self):
        """A ``torch.utils.data.IterableDataset`` of steps; use ``DataLoader(ds, batch_size=None)``."""
        from reader.torch_dataset import SnapshotIterableDataset

        if self._placement.device is not None or self._placement.prefetch_to_device:
            raise UsageError(
                "to_torch() feeds a DataLoader, whose workers cannot place tensors on a device: iterate the "
                "dataset itself for device=/prefetch_to_device=, or use DataLoader(..., pin_memory=True) and "
                "move each step with .to(device, non_blocking=True)"
            )

        return SnapshotIterableDataset(self.snapshot, self.options, self._map_fn)


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


def _options(
    global_batch_size: int,
    *,
    strategy,
    num_replicas: int | None,
    input_context,
    output: str = "numpy",
    shard_policy: str | ShardPolicy = "AUTO",
    **kwargs,
) -> ReaderOptions:
    """The reader's options; without a strategy or an explicit context, the input context is the
    process group's (``reader.process_groups``)."""
    if strategy is not None and (num_replicas is not None or input_context is not None):
        raise UsageError("give either strategy= or num_replicas=/input_context=, not both")
    if num_replicas is not None and input_context is not None:
        raise UsageError("give either num_replicas= or input_context= (which carries num_replicas_in_sync)")
    if num_replicas is not None and (isinstance(num_replicas, bool) or num_replicas < 1):
        raise UsageError(f"num_replicas={num_replicas!r}; give a positive integer")
    if strategy is not None:
        context = InputContext()  # tf.distribute gives each worker's pipeline its context later
    elif input_context is None and num_replicas is None:
        context = process_groups.default_context(output)
    else:
        context = InputContext.coerce(input_context, num_replicas=num_replicas)
        if ShardPolicy.parse(shard_policy) is not ShardPolicy.OFF:  # OFF: every process reads everything, on purpose
            process_groups.check_context(context, output)
    return ReaderOptions.build(global_batch_size, context=context, output=output, shard_policy=shard_policy, **kwargs)


def distributed_dataset(
    root_or_snapshot,
    global_batch_size: int,
    *,
    strategy=None,
    num_replicas: int | None = None,
    input_context=None,
    shard_policy: str = "AUTO",
    shuffle: bool = True,
    seed: int | None = None,
    shuffle_buffer_size: int | str = AUTO,
    reshuffle_each_epoch: bool = True,
    num_epochs: int | None = 1,
    drop_remainder: bool = False,
    columns: str | Sequence[str] | None = None,
    num_reader_threads: int | str = AUTO,
    num_io_threads: int | str = AUTO,
    read_ahead_bytes: int | str = AUTO,
    reader_buffer_size: int | str = AUTO,
    prefetch: int | str = AUTO,
    verify_checksums: bool = False,
    output: str = "numpy",
    sharding=None,
    device=None,
    prefetch_to_device: int = 0,
    input_options=None,
    map_fn: Callable | None = None,
    mode: str = "auto",
    wait_seconds: float = 0,
    service: str | None = None,
    processing_mode: str = "distributed_epoch",
    job_name: str | None = None,
    service_auth_token: str | None = None,
    service_tls_ca: str | None = None,
    service_timeout_seconds: float = 60.0,
):
    """Shuffled, sharded, rebatched steps of a snapshot (see README: "Reading a snapshot").

    ``map_fn`` runs on every per-replica batch after conversion (with a
    strategy, inside the tf.data graph), e.g. to split features from labels.
    With ``service="grpc://host:port"`` rows come from the reader service's
    workers (``processing_mode`` distributed_epoch | parallel_epochs; consumers
    sharing a ``job_name`` share one job); batching and adapters are the same.
    ``service_tls_ca`` (a PEM file) is the CA that signed a TLS service's
    certificates; without it the service is reached in plaintext.
    ``service_timeout_seconds``: how long an unreachable dispatcher or workers
    are retried (with a warning logged) before ``ServiceUnavailableError``; a
    dispatcher never reached fails within 5 s.

    Placement (README: "Feeding accelerators"): ``sharding`` (a JAX
    ``jax.sharding.Sharding``, with ``output="jax"``) makes each step a dict
    of global ``jax.Array`` of ``global_batch_size`` rows; ``device`` (with
    ``output="torch"``) puts tensors on that torch device; ``prefetch_to_device=N``
    keeps N steps already placed ahead of the consumer; ``input_options`` (a
    ``tf.distribute.InputOptions``) is honoured with ``strategy=``. Without a
    strategy or an explicit context, a process in a ``torch.distributed`` group
    or in a multi-process JAX program (``output="jax"``) reads as input pipeline
    rank / world size.
    """
    placement = PlacementOptions.build(
        output=output,
        strategy=strategy,
        service=service,
        sharding=sharding,
        device=device,
        prefetch_to_device=prefetch_to_device,
        input_options=input_options,
    )
    options = _options(
        global_batch_size,
        strategy=strategy,
        num_replicas=num_replicas,
        input_context=input_context,
        shard_policy=shard_policy,
        shuffle=shuffle,
        seed=seed,
        shuffle_buffer_size=shuffle_buffer_size,
        reshuffle_each_epoch=reshuffle_each_epoch,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        columns=columns,
        num_reader_threads=num_reader_threads,
        num_io_threads=num_io_threads,
        read_ahead_bytes=read_ahead_bytes,
        reader_buffer_size=reader_buffer_size,
        prefetch=prefetch,
        verify_checksums=verify_checksums,
        output="tf" if strategy is not None else output,
    )
    snapshot = _open(root_or_snapshot, mode, wait_seconds)
    if service is not None:
        from reader.service.client import ServiceConnection, ServiceDataset

        connection = ServiceConnection(
            service,
            processing_mode,
            job_name,
            auth_token=service_auth_token,
            tls_ca=service_tls_ca,
            timeout_seconds=service_timeout_seconds,
        )
        return ServiceDataset(snapshot, options, connection, strategy=strategy, map_fn=map_fn, placement=placement)
    return DistributedDataset(snapshot, options, strategy, map_fn, placement)


def dataset(
    root_or_snapshot,
    batch_size: int,
    *,
    input_context=None,
    map_fn: Callable | None = None,
    mode: str = "auto",
    wait_seconds: float = 0,
    **options,
):
    """A ``tf.data.Dataset`` of batches of ``batch_size`` (per replica when ``input_context`` is given).

    For ``strategy.distribute_datasets_from_function(lambda ctx: reader.dataset(
    path, ctx.get_per_replica_batch_size(B), input_context=ctx))``: the pipeline
    yields one batch per replica of this worker in turn, as tf.distribute expects.
    """
    if "strategy" in options or "num_replicas" in options or "output" in options:
        raise UsageError(
            "reader.dataset takes input_context=; use reader.distributed_dataset for strategy/num_replicas/output"
        )
    context = InputContext.coerce(input_context)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size={batch_size!r}; it must be an integer >= 1")
    reader_options = _options(
        batch_size * context.num_replicas_in_sync, strategy=None, num_replicas=None, input_context=context, **options
    )
    return DistributedDataset(
        _open(root_or_snapshot, mode, wait_seconds), reader_options, map_fn=map_fn
    ).as_tf_dataset()
