"""Torch output placed on a device (``device=``): tensors on ``cuda:N`` or on the CPU.

A step is what ``reader.outputs.adapters.step_adapter("torch", ...)`` makes (a dict of
tensors, or one per replica; ``map_fn`` runs there, on host tensors, like a
DataLoader transform), then moved to the device. Object columns (strings,
bytes, lists) stay NumPy: no device holds them.

CUDA copies go straight from the reader's batch memory with ``non_blocking=True``:
from pageable memory CUDA stages the bytes itself and returns once they are
staged, so the reader may reuse the batch at once and nothing is copied twice.
Staging through ``pin_memory()`` first (as before) added a host copy per tensor
and halved the rate (docs/architecture.md §9.5). Made on
the consumer's own thread (no ``prefetch_to_device``) they go on its current
stream, so its later kernels are ordered after them. Made ahead on the device
prefetch thread they go on a side stream of their own, so they overlap the
consumer's step; ``deliver`` then makes the consumer's current stream wait for
them, and ``record_stream`` tells the caching allocator that the consumer's
stream uses the memory, so it is not handed out again while kernels still read it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from reader.core.background import BackgroundProducer
from reader.outputs.adapters import Spec, step_adapter
from schemas.errors import UsageError


def torch_device(device: object):
    """``device`` as a ``torch.device`` this machine has, else one ``UsageError`` saying what to pass."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise UsageError(
            f"device={device!r} is not a torch device ({exc}); give e.g. 'cuda:0', 'cuda' or 'cpu'"
        ) from None
    if parsed.type == "cpu":
        return parsed
    if parsed.type != "cuda":
        raise UsageError(
            f"device={device!r}: the reader places tensors on 'cuda' or 'cpu' devices; for {parsed.type!r} "
            f"leave device= out and move the tensors in map_fn or in the training step"
        )
    if not torch.cuda.is_available():
        raise UsageError(
            f"device={device!r} but this machine has no CUDA device (torch.cuda.is_available() is False); "
            f"run on a machine with a GPU and a CUDA build of torch, or pass device='cpu' (or leave device= out)"
        )
    count = torch.cuda.device_count()
    if parsed.index is not None and parsed.index >= count:
        raise UsageError(
            f"device={device!r} but this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}; "
            f"pick one of them (with DDP usually cuda:<local rank>)"
        )
    return parsed if parsed.index is not None else torch.device("cuda", torch.cuda.current_device())


def map_leaves(tree: Any, leaf_type: type, change: Callable) -> Any:
    """``tree`` with every ``leaf_type`` value in its dicts, lists and tuples replaced by ``change(value)``."""
    if isinstance(tree, leaf_type):
        return change(tree)
    if isinstance(tree, dict):
        return {name: map_leaves(value, leaf_type, change) for name, value in tree.items()}
    if isinstance(tree, list | tuple):
        values = [map_leaves(value, leaf_type, change) for value in tree]
        return type(tree)(*values) if hasattr(tree, "_fields") else type(tree)(values)  # namedtuples too
    return tree


class _InFlight:
    """A step copied on the side stream: its tensors on the device and the event recorded after the copies."""

    def __init__(self, step: Any, tensors: list, event) -> None:
        self.step = step
        self.tensors = tensors
        self.event = event


class _CudaPlacement:
    """Host steps to tensors on one CUDA device; see the module docstring for the streams."""

    def __init__(self, host_step: Callable[[list], Any], device) -> None:
        self._host_step = host_step
        self._device = device
        self._side_stream = None  # made by the first copy ahead of the consumer

    def _copy(self, tensor):
        return tensor.to(self._device, non_blocking=True)

    def __call__(self, batches: list) -> Any:
        import torch

        host = self._host_step(batches)
        if not isinstance(threading.current_thread(), BackgroundProducer):
            # The consumer's own thread: copies on its current stream come before its later kernels.
            return map_leaves(host, torch.Tensor, self._copy)
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(self._device)
        tensors = []

        def copy(tensor):
            tensors.append(self._copy(tensor))
            return tensors[-1]

        with torch.cuda.stream(self._side_stream):
            step = map_leaves(host, torch.Tensor, copy)
            event = torch.cuda.Event()
            event.record(self._side_stream)
        return _InFlight(step, tensors, event)

    def deliver(self, made: Any) -> Any:
        """On the consumer's thread: its current stream waits for the copies, then owns their memory."""
        import torch

        consumer = torch.cuda.current_stream(self._device)
        consumer.wait_event(made.event)
        for tensor in made.tensors:
            tensor.record_stream(consumer)
        return made.step


def device_step_adapter(spec: Spec, device: object, map_fn: Callable | None = None) -> Callable[[list], Any]:
    """One step (a list of per-replica host batches) to torch output on ``device``.

    CPU: the plain torch output (tensors share the reader's batch memory, no copy).
    CUDA: a callable with ``deliver`` for ``reader.outputs.device_prefetch.DevicePrefetcher``.
    """
    host_step = step_adapter("torch", spec, map_fn)
    placed = torch_device(device)
    if placed.type == "cpu":
        return host_step
    return _CudaPlacement(host_step, placed)
