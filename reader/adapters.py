"""Turning the core's per-replica NumPy batches into what a framework wants.

Frameworks are imported only when their output is asked for, so ``import
reader`` stays light. Binary and string columns stay NumPy object arrays
except for TensorFlow, which has a string dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from reader.blocks import Columns
from reader.snapshot import TensorSpec

Adapter = Callable[[Columns], object]


def _numpy(batch: Columns) -> Columns:
    return batch


def _torch() -> Adapter:
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


def _jax() -> Adapter:
    import jax.numpy as jnp

    def convert(batch: Columns) -> dict:
        return {name: values if values.dtype == object else jnp.asarray(values) for name, values in batch.items()}

    return convert


def _tf() -> Adapter:
    import tensorflow as tf

    def convert(batch: Columns) -> dict:
        return {name: tf.convert_to_tensor(values) for name, values in batch.items()}

    return convert


def batch_adapter(output: str) -> Adapter:
    return {"numpy": lambda: _numpy, "torch": _torch, "jax": _jax, "tf": _tf}[output]()


def step_adapter(output: str, map_fn: Callable | None = None) -> Callable[[list[Columns]], object]:
    """One step: a single batch for one replica, else the list of per-replica batches.

    ``map_fn`` (the user's) runs on every converted per-replica batch.
    """
    convert = batch_adapter(output)
    if map_fn is not None:
        plain = convert

        def convert(batch: Columns) -> object:
            return map_fn(plain(batch))

    def adapt(batches: list[Columns]) -> object:
        converted = [convert(batch) for batch in batches]
        return converted[0] if len(converted) == 1 else converted

    return adapt


def tf_signature(spec: dict[str, TensorSpec]) -> dict:
    """``tf.TensorSpec`` per column, batch dimension None: usable as a tf.function input_signature."""
    import tensorflow as tf

    def dtype(column: TensorSpec):
        return tf.string if isinstance(column.dtype, str) else tf.as_dtype(np.dtype(column.dtype))

    return {name: tf.TensorSpec(shape=column.shape, dtype=dtype(column), name=name) for name, column in spec.items()}
