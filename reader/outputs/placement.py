"""Where a step goes after the host: the options of device placement, checked before anything is read.

The core hands out NumPy steps; placing them (a JAX sharding, a torch device,
steps transferred ahead, TensorFlow's ``tf.distribute.InputOptions``) is the
outputs' business, so its options live here and not in ``ReaderOptions``.
"""

from __future__ import annotations

import dataclasses

from schemas.errors import UsageError


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlacementOptions:
    """Where steps go after the host: a JAX sharding, a torch device, steps transferred ahead, and
    TensorFlow's ``tf.distribute.InputOptions`` (docs/accelerators.md "Feeding accelerators").

    Kept apart from the options that choose rows: they do not change which rows
    a step holds (nor the iterator state's config digest), and shardings and
    devices belong to this process (never pickled into loader workers or sent
    to the service).

    Args:
        sharding: a ``jax.sharding.Sharding`` (with ``output="jax"``): each step is a dict of global
            ``jax.Array`` of ``global_batch_size`` rows, laid out as it says.
        device: a torch device (with ``output="torch"``) the tensors are put on.
        prefetch_to_device: steps kept already placed ahead of the consumer (0: none).
        input_options: a ``tf.distribute.InputOptions``, honoured with ``strategy=``.
    """

    sharding: object = None
    device: object = None
    prefetch_to_device: int = 0
    input_options: object = None

    def __post_init__(self) -> None:
        depth = self.prefetch_to_device
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise UsageError(f"prefetch_to_device={depth!r}; give a non-negative integer (0: no device prefetch)")

    def check_for(self, *, output: str, strategy: object, service: object) -> None:
        """What this placement needs of the rest of the dataset, checked before anything is read."""
        depth = self.prefetch_to_device
        if self.sharding is not None and output != "jax":
            raise UsageError(f"sharding= places JAX arrays; it needs output='jax' (got output={output!r})")
        if self.device is not None and output != "torch":
            raise UsageError(
                f"device= places torch tensors; it needs output='torch' (got output={output!r}); "
                f"for JAX pass sharding=, for TensorFlow a strategy"
            )
        if self.device is not None:
            from reader.outputs.torch_output import torch_device  # a device this machine lacks: refused before reading

            torch_device(self.device)
        if depth and output not in ("jax", "torch"):
            raise UsageError(
                f"prefetch_to_device={depth} needs output='jax' or 'torch' (got {output!r}); with a "
                f"tf.distribute strategy pass placement=PlacementOptions(input_options=tf.distribute.InputOptions(...))"
            )
        if self.input_options is not None:
            _check_input_options(self.input_options, strategy)
        if self.sharding is not None and service is not None:
            raise UsageError(
                "sharding= needs every JAX process to take the same number of steps, which the service's "
                "consumers do not; read locally (no service=) for sharded global arrays"
            )


def _check_input_options(input_options: object, strategy: object) -> None:
    """Anything but a ``tf.distribute.InputOptions`` would fail deep inside tf.distribute with an AttributeError."""
    if strategy is None:
        raise UsageError("input_options= (tf.distribute.InputOptions) applies with strategy=; pass a strategy")
    import tensorflow as tf

    if not isinstance(input_options, tf.distribute.InputOptions):
        raise UsageError(
            f"input_options={input_options!r} is not a tf.distribute.InputOptions; pass "
            f"tf.distribute.InputOptions(experimental_fetch_to_device=..., experimental_per_replica_buffer_size=...)"
        )
