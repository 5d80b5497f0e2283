"""Turning the core's per-replica NumPy batches into what a framework wants.

Frameworks are imported only when their output is asked for, so ``import
reader`` stays light. Strings, bytes and variable-length lists stay NumPy
object arrays (a 1-D array per row for lists) except for TensorFlow, which
has a string dtype and ragged tensors: missing strings become ``b""`` there
(``tf.string`` has no missing value; ``tf.io.parse_example`` fills ``""`` too)
and lists become ``tf.RaggedTensor``. JAX's default 32-bit mode would turn
64-bit columns into 32-bit ones silently, so that is warned about, with the fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from reader.core.allocator import Columns
from reader.core.snapshot import TensorSpec

Adapter = Callable[[Columns], object]
Spec = dict[str, TensorSpec]


def _numpy(spec: Spec) -> Adapter:
    return lambda batch: batch


def _torch(spec: Spec) -> Adapter:
    import torch

    def convert(batch: Columns) -> dict:
        out = {}
        for name, values in batch.items():
            if values.dtype == object:
                out[name] = values
            else:
                out[name] = torch.from_numpy(values if values.flags.writeable else values.copy())
        return out

    return convert


def warn_if_jax_narrows(spec: Spec) -> None:
    """Warns when JAX's default 32-bit mode would turn the 64-bit columns of ``spec`` into 32-bit arrays."""
    import jax

    wide = [name for name, column in spec.items() if column.fixed_width and column.dtype.itemsize == 8]
    if wide and not jax.config.jax_enable_x64:
        warnings.warn(
            f"output='jax': columns {wide} are 64-bit, and JAX's default 32-bit mode turns them into 32-bit "
            f"arrays (int64 values beyond 2**31 wrap); to keep them 64-bit call "
            f"jax.config.update('jax_enable_x64', True) before reading, or cast them in map_fn",
            stacklevel=5,
        )


def _jax(spec: Spec) -> Adapter:
    import jax.numpy as jnp

    warn_if_jax_narrows(spec)

    def convert(batch: Columns) -> dict:
        return {name: values if values.dtype == object else jnp.asarray(values) for name, values in batch.items()}

    return convert


def _tf_dtype(column: TensorSpec):
    import tensorflow as tf

    return tf.string if isinstance(column.dtype, str) else tf.as_dtype(column.dtype)


def _tf(spec: Spec) -> Adapter:
    import tensorflow as tf

    def strings(values: np.ndarray) -> list:
        return [b"" if value is None else value for value in values]

    def ragged(column: TensorSpec, values: np.ndarray):
        flat = np.concatenate(list(values)) if len(values) else []
        flat = strings(flat) if isinstance(column.dtype, str) else flat
        lengths = np.fromiter((len(row) for row in values), np.int64, len(values))
        return tf.RaggedTensor.from_row_lengths(tf.constant(flat, _tf_dtype(column)), lengths)

    def convert_column(name: str, values: np.ndarray):
        column = spec[name]
        if column.ragged:
            return ragged(column, values)
        if isinstance(column.dtype, str):
            return tf.constant(strings(values), tf.string, shape=[len(values)])
        return tf.convert_to_tensor(values)

    def convert(batch: Columns) -> dict:
        return {name: convert_column(name, values) for name, values in batch.items()}

    return convert


def batch_adapter(output: str, spec: Spec) -> Adapter:
    """Converts one per-replica batch of the columns in ``spec`` to ``output``'s types."""
    return {"numpy": _numpy, "torch": _torch, "jax": _jax, "tf": _tf}[output](spec)


def step_adapter(output: str, spec: Spec, map_fn: Callable | None = None) -> Callable[[list[Columns]], object]:
    """One step: a single batch for one replica, else the list of per-replica batches.

    ``map_fn`` (the user's) runs on every converted per-replica batch.
    """
    convert = batch_adapter(output, spec)
    if map_fn is not None:
        plain = convert

        def convert(batch: Columns) -> object:
            return map_fn(plain(batch))

    def adapt(batches: list[Columns]) -> object:
        converted = [convert(batch) for batch in batches]
        return converted[0] if len(converted) == 1 else converted

    return adapt


def tf_signature(spec: Spec) -> dict:
    """A ``tf.TensorSpec`` per column (``tf.RaggedTensorSpec`` for lists), batch dimension None:
    usable as a tf.function input_signature."""
    import tensorflow as tf

    def signature(name: str, column: TensorSpec):
        if column.ragged:
            return tf.RaggedTensorSpec(shape=column.shape, dtype=_tf_dtype(column), ragged_rank=1)
        return tf.TensorSpec(shape=column.shape, dtype=_tf_dtype(column), name=name)

    return {name: signature(name, column) for name, column in spec.items()}
