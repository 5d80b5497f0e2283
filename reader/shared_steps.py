"""Steps from DataLoader workers to the training process through reused shared-memory slots.

A tensor a loader worker yields reaches the training process through torch's
queue pickler: a fresh shared-memory segment per tensor, the bytes copied in,
its file descriptor handed over a socket, mapped again in the training
process, and unmapped when freed. For 3 MB batches the fresh pages (zeroed and
faulted in on both sides) cost more than reading the rows: a worker spent 2.7
CPU s/GB where the same reader in-process spends 0.7, the training process 0.8.

Here each worker keeps one ring of ``SLOTS`` slots in ``/dev/shm``, made at its
first step. A step's tensors are copied into a free slot and the step travels as
the ring's name, the slot's number and the tensors' offsets, shapes and dtypes.
The training process maps the ring once (and removes its name then: nobody else
opens it, and the memory goes when both processes have unmapped it), keeps it
mapped while the worker process lives, and hands out tensors viewing the slot.
When the last of them is freed the slot is marked free in the ring's header,
and the worker writes another step into it. Steps whose tensors do not fit, or
that find every slot still held (a consumer keeping many steps, e.g.
``list(loader)``), go torch's usual way, so nothing waits.

Lifetime of the name: until the training process maps the ring, the worker's
resource tracker would remove it if the worker died, and the worker removes it
when it exits; once mapped, the name is gone and the worker stops tracking it.
"""

from __future__ import annotations

import dataclasses
import mmap
import multiprocessing.util
import os
import secrets
import sys
import weakref
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np
import torch

from reader.torch_output import map_leaves

#: Slots per worker: DataLoader's default prefetch_factor (2) in the queue, one step with the
#: consumer, one being written; a fifth while the consumer still holds the step before.
SLOTS = 5
#: The header byte the training process sets once it has mapped the ring (and removed its name).
MAPPED = SLOTS
_ALIGN = 64
_SHM_DIR = "/dev/shm"


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _step_bytes(step: Any) -> int:
    sizes = []
    map_leaves(step, torch.Tensor, lambda tensor: sizes.append(_aligned(tensor.nbytes)))
    return sum(sizes)


@dataclasses.dataclass(frozen=True)
class _InSlot:
    """Where one tensor of a step lies in its slot."""

    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype


class WorkerRing:
    """The worker's side: steps written into free slots of its shared-memory ring."""

    def __init__(self) -> None:
        self._header: np.ndarray | None = None  # a flag per slot (1: the training process holds it), then MAPPED
        self._data: torch.Tensor | None = None
        self._memory: shared_memory.SharedMemory | None = None
        self._slot_bytes = 0
        self._tracked = False

    @staticmethod
    def available() -> bool:
        """Only where shared memory is a directory the training process can open by name."""
        return sys.platform == "linux" and os.path.isdir(_SHM_DIR)

    def _create(self, slot_bytes: int) -> None:
        self._slot_bytes = slot_bytes
        name = f"snapfeed_{os.getpid()}_{secrets.token_hex(6)}"
        self._memory = shared_memory.SharedMemory(name, create=True, size=_ALIGN + SLOTS * slot_bytes)
        self._tracked = True
        multiprocessing.util.Finalize(self, self._remove, exitpriority=0)
        self._header = np.frombuffer(self._memory.buf, np.uint8, _ALIGN)
        self._data = torch.frombuffer(self._memory.buf, dtype=torch.uint8, offset=_ALIGN)

    def _untrack(self) -> None:
        resource_tracker.unregister(f"/{self._memory.name}", "shared_memory")
        self._tracked = False

    def _remove(self) -> None:
        """At the worker's exit: the name removed unless the training process has already done it."""
        mapped = bool(self._header[MAPPED])
        self._header = self._data = None  # views of the mapping first, or it cannot be closed
        self._memory.close()
        if self._tracked and not mapped:
            self._memory.unlink()
        elif self._tracked:
            self._untrack()

    def share(self, step: Any) -> Any:
        """``step`` as a slot of the ring when one is free and it fits, else ``step`` itself."""
        needed = _step_bytes(step)
        if needed == 0:
            return step
        if self._memory is None:
            self._create(needed)
        if self._tracked and self._header[MAPPED]:
            self._untrack()
        free = np.flatnonzero(self._header[:SLOTS] == 0)
        if needed > self._slot_bytes or not len(free):
            return step
        slot = int(free[0])
        self._header[slot] = 1
        offset = slot * self._slot_bytes

        def write(tensor: torch.Tensor) -> _InSlot:
            nonlocal offset
            start, offset = offset, offset + _aligned(tensor.nbytes)
            self._data[start : start + tensor.nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)
            return _InSlot(start, tuple(tensor.shape), tensor.dtype)

        return _SlotStep(self._memory.name, slot, map_leaves(step, torch.Tensor, write))


class _SlotStep:
    """What crosses the queue: the ring's name, the slot, and the step with ``_InSlot`` for tensors."""

    def __init__(self, ring: str, slot: int, layout: Any) -> None:
        self._args = (ring, slot, layout)

    def __reduce__(self):
        return _receive, self._args


class _MappedRing:
    """The training process's mapping of one worker's ring."""

    def __init__(self, name: str) -> None:
        path = os.path.join(_SHM_DIR, name)
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        os.unlink(path)
        self._header = np.frombuffer(self._map, np.uint8, _ALIGN)
        self._header[MAPPED] = 1
        self.worker_pid = int(name.split("_")[1])

    def worker_alive(self) -> bool:
        try:
            os.kill(self.worker_pid, 0)  # signal 0: only asks whether the process exists
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # it exists, owned by someone else
        return True

    def release(self, slot: int) -> None:
        self._header[slot] = 0

    def tensors(self, slot: int, layout: Any) -> Any:
        """The step's tensors, viewing the ring; the slot is released when the last of them is freed."""
        owner = np.frombuffer(self._map, np.uint8, offset=_ALIGN)
        weakref.finalize(owner, self.release, slot)  # the finalizer keeps this mapping alive until then
        data = torch.from_numpy(owner)

        def view(place: _InSlot) -> torch.Tensor:
            nbytes = int(np.prod(place.shape)) * place.dtype.itemsize
            return data[place.offset : place.offset + nbytes].view(place.dtype).view(place.shape)

        return map_leaves(layout, _InSlot, view)


#: The rings mapped in the training process, by name; a ring whose worker has exited is dropped
#: when the next ring is mapped (its live steps keep their own reference).
_mapped: dict[str, _MappedRing] = {}


def _receive(ring: str, slot: int, layout: Any) -> Any:
    """Unpickled in the training process: the step as tensors viewing its slot."""
    mapped = _mapped.get(ring)
    if mapped is None:
        for name, other in list(_mapped.items()):
            if not other.worker_alive():
                del _mapped[name]
        mapped = _mapped[ring] = _MappedRing(ring)
    return mapped.tensors(slot, layout)
