"""The public entry points, ``distributed_dataset`` and ``dataset``: where a dataset gets its source.

Both open the snapshot and validate the options once, then compose a
``DistributedDataset`` (``reader.dataset``) over a source (``reader.source``):
the local reader, or with ``service=`` the reader service's client. This is
the one core module that names the service, and it imports it only when
``service=`` is given, so ``import reader`` loads neither gRPC nor Flight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from reader import process_groups
from reader.core.mixture import Mixture
from reader.core.options import AUTO, CacheOptions, ReaderOptions, ReadOptions
from reader.core.plan import InputContext, ShardPolicy
from reader.core.union import as_readable
from reader.dataset import DistributedDataset
from reader.outputs.placement import PlacementOptions
from reader.service.options import ServiceOptions
from reader.source import LocalSource, StepSource
from schemas import extras
from schemas.errors import UsageError

#: The framework each output is made with: without it, one line naming the extra that installs it.
_OUTPUT_MODULES = {"tf": "tensorflow", "torch": "torch", "jax": "jax"}


def _context(strategy, num_replicas: int | None, input_context, output: str, shard_policy) -> InputContext:
    """This input pipeline's context; without a strategy or an explicit one, the process group's
    (``reader.process_groups``)."""
    if strategy is not None and (num_replicas is not None or input_context is not None):
        raise UsageError("give either strategy= or num_replicas=/input_context=, not both")
    if num_replicas is not None and input_context is not None:
        raise UsageError("give either num_replicas= or input_context= (which carries num_replicas_in_sync)")
    if num_replicas is not None and (isinstance(num_replicas, bool) or num_replicas < 1):
        raise UsageError(f"num_replicas={num_replicas!r}; give a positive integer")
    if strategy is not None:
        return InputContext()  # tf.distribute gives each worker's pipeline its context later
    if input_context is None and num_replicas is None:
        return process_groups.default_context(output)
    context = InputContext.coerce(input_context, num_replicas=num_replicas)
    if ShardPolicy.parse(shard_policy) is not ShardPolicy.OFF:  # OFF: every process reads everything, on purpose
        process_groups.check_context(context, output)
    return context


def _group(name: str, value, kind: type):
    """``read=``/``cache=``/``placement=`` as given, or the group's defaults for None; anything else is one line."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise UsageError(f"{name}={value!r}; give a reader.{kind.__name__}(...) or None")
    return value


def distributed_dataset(
    source,
    global_batch_size: int,
    *,
    strategy=None,
    num_replicas: int | None = None,
    input_context=None,
    shard_policy: str | ShardPolicy = ShardPolicy.AUTO.value,
    shuffle: bool = True,
    seed: int | None = None,
    shuffle_buffer_size: int | str = AUTO,
    reshuffle_each_epoch: bool = True,
    num_epochs: int | None = 1,
    drop_remainder: bool = False,
    columns: str | Sequence[str] | None = None,
    output: str = "numpy",
    map_fn: Callable | None = None,
    read: ReadOptions | None = None,
    cache: CacheOptions | None = None,
    placement: PlacementOptions | None = None,
    service: ServiceOptions | str | None = None,
    metrics=None,
) -> DistributedDataset:
    """Shuffled, sharded, rebatched steps of a snapshot (docs/reading.md "Reading a snapshot").

    Each step holds a batch per replica of this input pipeline. Without a
    strategy or an explicit context, a process in a ``torch.distributed`` group
    or in a multi-process JAX program (``output="jax"``) reads as input
    pipeline rank / world size.

    Args:
        source: a snapshot folder (local, ``gs://``, ``s3://``) or a ``reader.open_snapshot(...)`` handle, which
            chooses among several snapshots under a root (``snapshot_name``, ``snapshot_id``, ``mode``, ``wait_seconds``);
            a view (``VIEW``: its latest version, ``VIEW@K``: version K); a list of these, read as one dataset;
            or a ``reader.mixture(...)`` of sources with weights.
        global_batch_size: rows of one step across every replica of every input pipeline.
        strategy: a ``tf.distribute`` strategy: steps are ``PerReplica`` values, and Keras can fit on the dataset.
        num_replicas: replicas this process feeds, each getting ``global_batch_size / num_replicas`` rows a step.
        input_context: a ``tf.distribute.InputContext`` or ``reader.InputContext`` naming this input pipeline.
        shard_policy: AUTO, FILE, DATA or OFF, as tf.data's ``AutoShardPolicy`` (docs/reading.md "Shuffling, sharding, rebatching").
        shuffle: shuffle rows across the whole snapshot (False: stored order).
        seed: the shuffle's seed; None: a random one (every input pipeline must then be given the same).
        shuffle_buffer_size: rows of one shuffle window; AUTO: about 32 MB of rows.
        reshuffle_each_epoch: a new order every epoch (False: every epoch in the first one's order).
        num_epochs: epochs of one iteration; None: repeat forever.
        drop_remainder: drop the last partial step of an epoch instead of yielding it.
        columns: the columns to read (a name or a list); None: every column.
        output: ``"numpy"``, ``"tf"``, ``"torch"`` or ``"jax"``.
        map_fn: runs on every per-replica batch after conversion (with a strategy, inside the tf.data graph).
        read: how the local reader reads (``reader.ReadOptions``: threads, read-ahead, prefetch, checksums).
        cache: a local cache of bucket shards (``reader.CacheOptions``).
        placement: where steps go after the host (``reader.PlacementOptions``: a JAX sharding, a torch device,
            device prefetch, ``tf.distribute.InputOptions``).
        service: read through the reader service: ``"grpc://host:port"`` or ``reader.ServiceOptions(...)``; its
            workers read, the batching and outputs are the same. ``read=`` tunings and ``cache=`` are refused with it.
        metrics: every iterator's ``stats()`` as Prometheus counters, on a ``prometheus_client.CollectorRegistry``
            or served on a port (``9100``, ``"127.0.0.1:9100"``, 0 for any: ``dataset.metrics_address``).

    Returns:
        A ``reader.DistributedDataset``: iterate it, or take ``as_tf_dataset()``, ``to_torch()``, ``tf_dataset``.
    """
    if metrics is not None and strategy is not None:
        raise UsageError(
            "metrics= counts the steps of a dataset iterated in Python; with strategy= TensorFlow iterates "
            "tf_dataset itself: see its input wait in TensorFlow's profiler, or drop strategy="
        )
    service = None if service is None else ServiceOptions.coerce(service)
    placement = _group("placement", placement, PlacementOptions)
    placement.check_for(output=output, strategy=strategy, service=service)
    options = ReaderOptions(
        global_batch_size=global_batch_size,
        context=_context(strategy, num_replicas, input_context, output, shard_policy),
        shard_policy=shard_policy,
        shuffle=shuffle,
        seed=seed,
        shuffle_buffer_size=shuffle_buffer_size,
        reshuffle_each_epoch=reshuffle_each_epoch,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        columns=columns,
        output="tf" if strategy is not None else output,
        read=_group("read", read, ReadOptions),
        cache=_group("cache", cache, CacheOptions),
    )
    if module := _OUTPUT_MODULES.get(options.output):
        extras.require(module, "strategy=" if strategy is not None else f"output={options.output!r}")
    snapshot = source if isinstance(source, Mixture) else as_readable(source)
    if service is None:
        steps: StepSource = LocalSource(snapshot, options)
    else:
        from reader.service.client import ServiceConnection, ServiceSource

        steps = ServiceSource(snapshot, options, ServiceConnection(service))
    return DistributedDataset(steps, strategy, map_fn, placement, metrics)


def dataset(
    source,
    batch_size: int,
    *,
    input_context=None,
    shard_policy: str | ShardPolicy = ShardPolicy.AUTO.value,
    shuffle: bool = True,
    seed: int | None = None,
    shuffle_buffer_size: int | str = AUTO,
    reshuffle_each_epoch: bool = True,
    num_epochs: int | None = 1,
    drop_remainder: bool = False,
    columns: str | Sequence[str] | None = None,
    map_fn: Callable | None = None,
    read: ReadOptions | None = None,
    cache: CacheOptions | None = None,
):
    """A ``tf.data.Dataset`` of batches of ``batch_size`` (per replica when ``input_context`` is given), read locally.

    For ``strategy.distribute_datasets_from_function(lambda ctx: reader.dataset(
    path, ctx.get_per_replica_batch_size(B), input_context=ctx))``: the pipeline
    yields one batch per replica of this worker in turn, as tf.distribute expects.
    For a strategy, another output, placement or the service, use ``reader.distributed_dataset``.

    Args:
        source: as ``reader.distributed_dataset``'s: a snapshot folder or handle, a view, a list of these, a mixture.
        batch_size: rows of each batch: per replica, with ``input_context``.
        input_context: the ``tf.distribute.InputContext`` tf.distribute gives this worker's pipeline.
        shard_policy: as ``reader.distributed_dataset``'s.
        shuffle: as ``reader.distributed_dataset``'s.
        seed: as ``reader.distributed_dataset``'s.
        shuffle_buffer_size: as ``reader.distributed_dataset``'s.
        reshuffle_each_epoch: as ``reader.distributed_dataset``'s.
        num_epochs: as ``reader.distributed_dataset``'s.
        drop_remainder: as ``reader.distributed_dataset``'s.
        columns: as ``reader.distributed_dataset``'s.
        map_fn: runs on every batch, inside the tf.data graph.
        read: a ``reader.ReadOptions``.
        cache: a ``reader.CacheOptions``.

    Returns:
        A ``tf.data.Dataset``.
    """
    extras.require("tensorflow", "reader.dataset (a tf.data.Dataset)")
    context = InputContext.coerce(input_context)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size={batch_size!r}; it must be an integer >= 1")
    pipeline = distributed_dataset(
        source,
        batch_size * context.num_replicas_in_sync,
        input_context=context,
        shard_policy=shard_policy,
        shuffle=shuffle,
        seed=seed,
        shuffle_buffer_size=shuffle_buffer_size,
        reshuffle_each_epoch=reshuffle_each_epoch,
        num_epochs=num_epochs,
        drop_remainder=drop_remainder,
        columns=columns,
        map_fn=map_fn,
        read=read,
        cache=cache,
    )
    return pipeline.as_tf_dataset()
