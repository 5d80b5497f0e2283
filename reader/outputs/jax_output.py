"""Steps as global ``jax.Array``s laid out by a JAX sharding, each process giving only its own rows.

With ``sharding=`` every step is one dict of global arrays of
``global_batch_size`` rows. Each process reads its own part of the snapshot
(one input pipeline per JAX process, ``reader.process_groups``) and hands
exactly those rows to ``jax.make_array_from_process_local_data``, which puts
them on this process's devices: no row goes through another host.

Partial final batches: with ``drop_remainder=False`` every process pads its
rows with zeros up to its full share of the batch, and the step carries a
boolean column ``__valid__`` (True for real rows). Shapes never change, so a
jitted step compiles once and the sharding always divides the batch; the
mask is in every step (not only the last), so the pytree a jitted function
sees never changes either. With ``drop_remainder=True`` partial steps are
dropped and there is no mask. A process whose rows ran out while others
still have some (equal steps for every process, ``reader.core.plan``) gives an
all-padding share.

The conversion blocks until the arrays are on the devices. Under
``prefetch_to_device=N`` it runs on the prefetch thread, so the N steps held
ahead are really transferred, not merely dispatched (JAX dispatch is
asynchronous); without prefetch the train step needs the arrays anyway.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from reader.core.allocator import Columns
from reader.core.options import ReaderOptions
from reader.core.snapshot import TensorSpec
from reader.outputs.adapters import Spec, warn_if_jax_narrows
from schemas.errors import UsageError

#: The mask column of padded steps (``drop_remainder=False``): True for real rows, False for padding.
VALID = "__valid__"


def _batch_splits(probe: tuple[int, ...], devices_indices_map) -> int:
    """How many distinct row ranges the sharding cuts the batch dimension of ``probe`` into, over the
    devices that ``devices_indices_map`` (all of them, or this process's) covers."""
    return len({index[0].indices(probe[0])[:2] for index in devices_indices_map(probe).values()})


def _mesh_description(sharding) -> str:
    mesh = getattr(sharding, "mesh", None)
    if mesh is None:
        return f"{sharding.num_devices} devices"
    return f"mesh axes {dict(mesh.shape)}, spec {sharding.spec}"


def _check_columns(spec: Spec, options: ReaderOptions) -> None:
    not_arrays = [name for name, column in spec.items() if not column.fixed_width]
    if not_arrays:
        keep = [name for name in spec if name not in not_arrays]
        raise UsageError(
            f"sharding=: columns {not_arrays} are strings, bytes or variable-length lists, which cannot be "
            f"jax.Arrays; leave them out with columns={keep}"
        )
    if not options.drop_remainder and VALID in spec:
        raise UsageError(
            f"sharding= with drop_remainder=False adds the mask column {VALID!r}, and the snapshot has a column of "
            f"that name; leave it out with columns=, or pass drop_remainder=True (no padding, no mask)"
        )


def _probe_shape(spec: Spec, options: ReaderOptions, sharding) -> tuple[int, ...]:
    """Refuses a sharding that does not fit some column's rank or row shape; returns a shape that
    fits it, with a batch axis that any split of the batch divides (splits divide the device count)."""
    row_shapes = {name: column.shape[1:] for name, column in spec.items()}
    if not options.drop_remainder:
        row_shapes[VALID] = ()
    probe = (sharding.num_devices,)
    for name, row_shape in row_shapes.items():
        probe = (sharding.num_devices, *row_shape)
        if (misfit := _misfit(sharding, probe)) is not None:
            raise UsageError(
                f"sharding= ({_mesh_description(sharding)}) does not fit column {name!r}, whose rows have shape "
                f"{row_shape}: {misfit}; shard only the batch axis (e.g. PartitionSpec('data'))"
            )
    return probe


def _misfit(sharding, shape: tuple[int, ...]) -> str | None:
    """Why ``sharding`` cannot lay out an array of ``shape``, or None."""
    try:
        sharding.shard_shape(shape)
    except IndexError:  # what JAX raises for a spec longer than the rank
        return f"it partitions more axes than the column's {len(shape)}"
    except ValueError as error:
        return str(error)
    return None


def _check_batch_axis(sharding, probe: tuple[int, ...], batch: int, processes: int) -> None:
    """Each process's devices must hold its own 1/processes of the batch, in equal parts."""
    splits = _batch_splits(probe, sharding.devices_indices_map)
    local_splits = _batch_splits(probe, sharding.addressable_devices_indices_map)
    if splits != local_splits * processes:
        raise UsageError(
            f"sharding= ({_mesh_description(sharding)}) cuts the batch into {splits} parts, {local_splits} of them on "
            f"this process's devices, but the reader has {processes} input pipelines (one per process): each "
            f"process must hold 1/{processes} of the batch. Shard the batch axis over every process's devices"
        )
    if batch % splits:
        raise UsageError(
            f"global_batch_size={batch} over {processes} process(es) is {batch / processes:g} rows per process, "
            f"which the sharding's batch axis ({_mesh_description(sharding)}: {local_splits} parts per process) "
            f"does not divide; use a global_batch_size that is a multiple of {splits}"
        )


def check_sharding(spec: Spec, options: ReaderOptions, sharding) -> int:
    """Refuses, before the first step, what cannot become global arrays with ``sharding``; returns the
    rows this process gives each step (``global_batch_size`` / number of processes)."""
    import jax

    if not isinstance(sharding, jax.sharding.Sharding):
        raise UsageError(
            f"sharding={sharding!r}; give a jax.sharding.Sharding, e.g. NamedSharding(mesh, PartitionSpec('data'))"
        )
    context = options.context
    if context.replicas_per_pipeline > 1:
        raise UsageError(
            f"sharding= spreads each process's rows over its devices itself, but num_replicas=/input_context "
            f"asks for {context.replicas_per_pipeline} replicas per process: leave num_replicas= out (an "
            f"input_context must have one replica per process)"
        )
    _check_columns(spec, options)
    probe = _probe_shape(spec, options, sharding)
    _check_batch_axis(sharding, probe, options.global_batch_size, context.num_input_pipelines)
    return options.global_batch_size // context.num_input_pipelines


def _padded(batch: Columns, rows: int) -> Columns:
    """This process's rows, zeros after them up to ``rows``, and the ``__valid__`` mask."""
    real = len(next(iter(batch.values()))) if batch else 0
    valid = np.zeros(rows, dtype=bool)
    valid[:real] = True
    if real == rows:
        return {**batch, VALID: valid}
    padded = {}
    for name, values in batch.items():
        padded[name] = np.zeros((rows, *values.shape[1:]), dtype=values.dtype)
        padded[name][:real] = values
    return {**padded, VALID: valid}


def step_spec(spec: Spec, options: ReaderOptions) -> dict[str, TensorSpec]:
    """What each sharded step holds: every column with ``global_batch_size`` rows, and the
    ``__valid__`` mask when partial steps are padded (``element_spec`` with ``sharding=``)."""
    batch = options.global_batch_size
    step = {name: TensorSpec(name, (batch, *column.shape[1:]), column.dtype) for name, column in spec.items()}
    if not options.drop_remainder:
        step[VALID] = TensorSpec(VALID, (batch,), np.dtype(bool))
    return step


def sharded_step_adapter(
    spec: Spec, options: ReaderOptions, sharding, map_fn: Callable | None = None
) -> Callable[[list[Columns]], object]:
    """One step (this process's single host batch) to a dict of global arrays laid out by ``sharding``;
    ``map_fn`` runs on that dict."""
    import jax

    rows = check_sharding(spec, options, sharding)
    warn_if_jax_narrows(spec)
    shapes = {name: column.shape for name, column in step_spec(spec, options).items()}

    def adapt(batches: list[Columns]) -> object:
        (batch,) = batches
        local = batch if options.drop_remainder else _padded(batch, rows)
        arrays = jax.make_array_from_process_local_data(sharding, local, {name: shapes[name] for name in local})
        jax.block_until_ready(arrays)
        return arrays if map_fn is None else map_fn(arrays)

    return adapt
