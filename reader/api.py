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
from reader.core.options import AUTO, ReaderOptions
from reader.core.plan import InputContext, ShardPolicy
from reader.core.snapshot import Snapshot, open_snapshot
from reader.dataset import DistributedDataset
from reader.outputs.placement import PlacementOptions
from reader.source import LocalSource, StepSource
from schemas import extras
from schemas.errors import UsageError

#: The framework each output is made with: without it, one line naming the extra that installs it.
_OUTPUT_MODULES = {"tf": "tensorflow", "torch": "torch", "jax": "jax"}


def _open(root_or_snapshot, snapshot_name: str | None, snapshot_id: str | None, mode: str, wait_seconds: float):
    """The snapshot to read: one already opened, or the one ``open_snapshot`` chooses under a root."""
    if isinstance(root_or_snapshot, Snapshot):
        if snapshot_name is not None or snapshot_id is not None:
            raise UsageError(
                f"{root_or_snapshot.path} is an opened snapshot: snapshot_name=/snapshot_id= choose one under a root"
            )
        return root_or_snapshot
    return open_snapshot(
        str(root_or_snapshot),
        snapshot_name=snapshot_name,
        snapshot_id=snapshot_id,
        mode=mode,
        wait_seconds=wait_seconds,
    )


def _options(
    global_batch_size: int,
    *,
    strategy,
    num_replicas: int | None,
    input_context,
    output: str,
    shard_policy: str | ShardPolicy,
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
    shard_policy: str = ReaderOptions.shard_policy.value,
    shuffle: bool = ReaderOptions.shuffle,
    seed: int | None = ReaderOptions.seed,
    shuffle_buffer_size: int | str = AUTO,
    reshuffle_each_epoch: bool = ReaderOptions.reshuffle_each_epoch,
    num_epochs: int | None = ReaderOptions.num_epochs,
    drop_remainder: bool = ReaderOptions.drop_remainder,
    columns: str | Sequence[str] | None = ReaderOptions.columns,
    num_reader_threads: int | str = AUTO,
    num_io_threads: int | str = AUTO,
    read_ahead_bytes: int | str = AUTO,
    reader_buffer_size: int | str = AUTO,
    prefetch: int | str = AUTO,
    verify_checksums: bool | str = ReaderOptions.verify_checksums,
    cache_dir: str | None = ReaderOptions.cache_dir,
    cache_bytes: int | str = AUTO,
    output: str = ReaderOptions.output,
    sharding=None,
    device=None,
    prefetch_to_device: int = 0,
    input_options=None,
    map_fn: Callable | None = None,
    snapshot_name: str | None = None,
    snapshot_id: str | None = None,
    mode: str = "auto",
    wait_seconds: float = 0,
    service: str | None = None,
    processing_mode: str = "distributed_epoch",
    job_name: str | None = None,
    service_auth_token: str | None = None,
    service_tls_ca: str | None = None,
    service_timeout_seconds: float = 60.0,
    metrics=None,
):
    """Shuffled, sharded, rebatched steps of a snapshot (docs/reading.md "Reading a snapshot").

    ``map_fn`` runs on every per-replica batch after conversion (with a
    strategy, inside the tf.data graph), e.g. to split features from labels.
    ``snapshot_name``/``snapshot_id`` choose a snapshot under a root holding
    several, as for ``reader.open_snapshot``.
    With ``service="grpc://host:port"`` rows come from the reader service's
    workers (``processing_mode`` distributed_epoch | parallel_epochs; consumers
    sharing a ``job_name`` share one job); batching and adapters are the same.
    ``service_tls_ca`` (a PEM file) is the CA that signed a TLS service's
    certificates; without it the service is reached in plaintext.
    ``cache_dir``: a local directory (or ``"auto"``: ``$SNAPFEED_CACHE_DIR``, else ``~/.cache/snapfeed``)
    keeping the shards of a bucket snapshot for later epochs, shared by the processes of a host, within
    ``cache_bytes`` (AUTO: 64 GiB or half the disk's free space); docs/reading.md "Caching bucket shards".
    ``service_timeout_seconds``: how long an unreachable dispatcher or workers
    are retried (with a warning logged) before ``ServiceUnavailableError``; a
    dispatcher never reached fails within 5 s.
    ``metrics``: every iterator's ``stats()`` as Prometheus counters, on a
    ``prometheus_client.CollectorRegistry`` or served on a port (``9100``,
    ``"127.0.0.1:9100"``, 0 for any: ``dataset.metrics_address``); docs/reading.md "Input wait".

    Placement (docs/accelerators.md "Feeding accelerators"): ``sharding`` (a JAX
    ``jax.sharding.Sharding``, with ``output="jax"``) makes each step a dict
    of global ``jax.Array`` of ``global_batch_size`` rows; ``device`` (with
    ``output="torch"``) puts tensors on that torch device; ``prefetch_to_device=N``
    keeps N steps already placed ahead of the consumer; ``input_options`` (a
    ``tf.distribute.InputOptions``) is honoured with ``strategy=``. Without a
    strategy or an explicit context, a process in a ``torch.distributed`` group
    or in a multi-process JAX program (``output="jax"``) reads as input pipeline
    rank / world size.
    """
    if metrics is not None and strategy is not None:
        raise UsageError(
            "metrics= counts the steps of a dataset iterated in Python; with strategy= TensorFlow iterates "
            "tf_dataset itself: see its input wait in TensorFlow's profiler, or drop strategy="
        )
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
        cache_dir=cache_dir,
        cache_bytes=cache_bytes,
        output="tf" if strategy is not None else output,
    )
    if module := _OUTPUT_MODULES.get(options.output):
        extras.require(module, "strategy=" if strategy is not None else f"output={options.output!r}")
    snapshot = _open(root_or_snapshot, snapshot_name, snapshot_id, mode, wait_seconds)
    if service is None:
        source: StepSource = LocalSource(snapshot, options)
    else:
        from reader.service.client import ServiceConnection, ServiceSource

        connection = ServiceConnection(
            service,
            processing_mode,
            job_name,
            auth_token=service_auth_token,
            tls_ca=service_tls_ca,
            timeout_seconds=service_timeout_seconds,
        )
        source = ServiceSource(snapshot, options, connection)
    return DistributedDataset(source, strategy, map_fn, placement, metrics)


#: Keywords of ``distributed_dataset`` that ``dataset`` does not take: tf.distribute gives it an input context,
#: its output is a ``tf.data.Dataset``, and it reads locally.
_NOT_FOR_DATASET = (
    "strategy",
    "num_replicas",
    "output",
    "sharding",
    "device",
    "prefetch_to_device",
    "input_options",
    "service",
    "processing_mode",
    "job_name",
    "service_auth_token",
    "service_tls_ca",
    "service_timeout_seconds",
    "metrics",
)


def dataset(
    root_or_snapshot,
    batch_size: int,
    *,
    input_context=None,
    map_fn: Callable | None = None,
    **options,
):
    """A ``tf.data.Dataset`` of batches of ``batch_size`` (per replica when ``input_context`` is given).

    For ``strategy.distribute_datasets_from_function(lambda ctx: reader.dataset(
    path, ctx.get_per_replica_batch_size(B), input_context=ctx))``: the pipeline
    yields one batch per replica of this worker in turn, as tf.distribute expects.
    ``options`` are ``distributed_dataset``'s options of local reads, with its defaults.
    """
    extras.require("tensorflow", "reader.dataset (a tf.data.Dataset)")
    if refused := [name for name in _NOT_FOR_DATASET if name in options]:
        raise UsageError(
            f"reader.dataset takes input_context= and reads locally ({', '.join(refused)} given); use "
            f"reader.distributed_dataset for strategy, num_replicas, output, placement or the service"
        )
    context = InputContext.coerce(input_context)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UsageError(f"batch_size={batch_size!r}; it must be an integer >= 1")
    global_batch_size = batch_size * context.num_replicas_in_sync
    pipeline = distributed_dataset(root_or_snapshot, global_batch_size, input_context=context, map_fn=map_fn, **options)
    return pipeline.as_tf_dataset()
