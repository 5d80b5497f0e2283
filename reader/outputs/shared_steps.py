"""Steps from DataLoader workers to the training process through reused shared-memory slots.

A tensor a loader worker yields reaches the training process through torch's
queue pickler: a fresh shared-memory segment per tensor, the bytes copied in,
its file descriptor handed over a socket, mapped again in the training
process, and unmapped when freed. For 3 MB batches the fresh pages (zeroed and
faulted in on both sides) cost more than reading the rows: a worker spent 2.7
CPU s/GB where the same reader in-process spends 0.7, the training process 0.8.

Here each worker keeps one ring of slots in ``/dev/shm``, made at its first
step and sized by it. The worker's reader gathers each batch straight into a
free slot (``WorkerRing.allocate`` is its ``reader.core.allocator.BatchAllocator``),
so a step whose tensors all still lie in their slot (``map_fn`` kept them or
none is given) crosses without a copy; any other step (new tensors from
``map_fn``, unshuffled steps viewing their window, batches gathered while no
slot was free) is copied into a free slot. The step travels as the ring's
name, the slot's number and the tensors' offsets, shapes and dtypes. The
training process maps the ring once (and removes its name then: nobody else
opens it, and the memory goes when both processes have unmapped it), keeps it
mapped while the worker process lives, and hands out tensors viewing the slot.
When the last of them is freed the slot is marked free in the ring's header,
and the worker gathers or writes another step into it. A slot lent to a batch
that is dropped in the worker is free again. Steps whose tensors do not fit,
or that find every slot still held (a consumer keeping many steps, e.g.
``list(loader)``), go torch's usual way, so nothing waits.

The header's flags are written by one side at a time: the worker turns a
free slot into lent or held, the training process a held one into free.

Lifetime of the name: until the training process maps the ring, the worker's
resource tracker would remove it if the worker died, and the worker removes it
when it exits; once mapped, the name is gone and the worker stops tracking it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import mmap
import multiprocessing.util
import os
import queue
import secrets
import sys
import threading
import weakref
from multiprocessing import resource_tracker, shared_memory
from typing import Any

import numpy as np
import torch

from reader.core.allocator import new_batch
from reader.outputs.torch_output import map_leaves

#: Slots the loader side needs: DataLoader's default prefetch_factor (2) in the queue, one step with
#: the consumer, one being written; a fifth while the consumer still holds the step before. A worker
#: whose reader lends slots to its gatherer adds its prefetch depth (``slots_for``).
SLOTS = 5
#: The header byte the training process sets once it has mapped the ring (and removed its name);
#: the slots' flags come before it.
MAPPED = 63
_ALIGN = 64
_SHM_DIR = "/dev/shm"
#: A slot's flag in the header: free, held by the training process, or lent to the worker's gatherer.
FREE, HELD, LENT = 0, 1, 2


def slots_for(prefetch: int) -> int:
    """Slots for a worker whose reader gathers into them: ``prefetch`` steps queued on the reader's
    prefetch thread and the one it gathers (or waits to queue), besides the loader's ``SLOTS``."""
    return min(SLOTS + prefetch + 1, MAPPED)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _step_bytes(step: Any) -> int:
    sizes = []
    map_leaves(step, torch.Tensor, lambda tensor: sizes.append(_aligned(tensor.nbytes)))
    return sum(sizes)


def _column_offsets(rows: int, empty_batch: dict[str, np.ndarray]) -> tuple[dict[str, int], int]:
    """Where each fixed-width column of a batch of ``rows`` rows starts in a slot, and the bytes they take."""
    offsets, end = {}, 0
    for name, empty in empty_batch.items():
        if empty.dtype != object:  # Python objects cannot live in shared memory
            offsets[name] = end
            end += _aligned(rows * empty.dtype.itemsize * math.prod(empty.shape[1:]))
    return offsets, end


@dataclasses.dataclass(frozen=True)
class _InSlot:
    """Where one tensor of a step lies in its slot."""

    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype


class WorkerRing:
    """The worker's side: steps written into free slots of its shared-memory ring, or gathered there.

    ``allocate`` (a ``reader.core.allocator.BatchAllocator``, called on the reader's
    prefetch thread) lends a free slot to a batch being gathered; ``share``
    (on the worker's main thread) hands a step whose tensors all lie in one
    lent slot over as it is, and copies any other step into a free slot.
    """

    def __init__(self, slots: int = SLOTS) -> None:
        if not 0 < slots <= MAPPED:
            raise ValueError(f"a ring has 1 to {MAPPED} slots, not {slots}")
        self._slots = slots
        self._lock = threading.Lock()  # the prefetch thread lends slots, the main thread shares them
        self._header: np.ndarray | None = None  # a flag per slot (FREE, HELD, LENT), then MAPPED
        self._data: torch.Tensor | None = None
        self._memory: shared_memory.SharedMemory | None = None
        self._slot_bytes = 0
        self._largest_batch = 0  # bytes asked of ``allocate`` before the ring was made
        self._lent: dict[int, int] = {}  # slot -> the loan (a number) of the batch gathered there
        #: (slot, loan) of lent batches dropped in this worker, put by their finalizers (which may not take
        #: ``_lock``: the collector may run while this thread holds it); their slots are freed under the lock.
        self._dropped_loans: queue.SimpleQueue = queue.SimpleQueue()
        self._loans = itertools.count()
        self._tracked = False

    @staticmethod
    def available() -> bool:
        """Only where shared memory is a directory the training process can open by name."""
        return sys.platform == "linux" and os.path.isdir(_SHM_DIR)

    def _create(self, slot_bytes: int) -> None:
        self._slot_bytes = slot_bytes
        name = f"snapfeed_{os.getpid()}_{secrets.token_hex(6)}"
        self._memory = shared_memory.SharedMemory(name, create=True, size=_ALIGN + self._slots * slot_bytes)
        self._tracked = True
        multiprocessing.util.Finalize(None, self._remove, exitpriority=0)  # at the worker's exit, not in the GC
        self._header = np.frombuffer(self._memory.buf, np.uint8, _ALIGN)
        self._data = torch.frombuffer(self._memory.buf, dtype=torch.uint8, offset=_ALIGN)

    def _untrack(self) -> None:
        resource_tracker.unregister(f"/{self._memory.name}", "shared_memory")
        self._tracked = False

    def _remove(self) -> None:
        """At the worker's exit: the name removed unless the training process has already done it."""
        with self._lock:
            mapped = bool(self._header[MAPPED])
            self._header = self._data = None  # views of the mapping first, or it cannot be closed
        try:
            self._memory.close()
        except BufferError:
            pass  # batches lent to the gatherer still view it: the mapping goes with the process
        if self._tracked and not mapped:
            self._memory.unlink()
        elif self._tracked:
            self._untrack()

    def _free_slot(self) -> int | None:
        self._free_dropped_loans()
        free = np.flatnonzero(self._header[: self._slots] == FREE)
        return int(free[0]) if len(free) else None

    def allocate(self, rows: int, empty_batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A batch's arrays, its fixed-width columns in a slot lent to it until ``share`` hands its step
        over or the batch is dropped; fresh arrays while the ring is not made yet (its first step sizes
        it), when the batch does not fit or no slot is free."""
        offsets, needed = _column_offsets(rows, empty_batch)
        with self._lock:
            if self._memory is None:
                self._largest_batch = max(self._largest_batch, needed)
            slot = self._free_slot() if self._header is not None and 0 < needed <= self._slot_bytes else None
            if slot is None:
                return new_batch(rows, empty_batch)
            loan = next(self._loans)
            self._header[slot], self._lent[slot] = LENT, loan
        owner = np.frombuffer(self._memory.buf, np.uint8, self._slot_bytes, _ALIGN + slot * self._slot_bytes)
        weakref.finalize(owner, self._dropped_loans.put, (slot, loan))  # views of ``owner`` keep it alive
        batch = new_batch(rows, {name: empty for name, empty in empty_batch.items() if name not in offsets})
        for name, start in offsets.items():
            empty = empty_batch[name]
            shape = (rows, *empty.shape[1:])
            nbytes = rows * empty.dtype.itemsize * math.prod(empty.shape[1:])
            batch[name] = owner[start : start + nbytes].view(empty.dtype).reshape(shape)
        return {name: batch[name] for name in empty_batch}

    def _free_dropped_loans(self) -> None:
        """Under ``_lock``: the slots of lent batches that were dropped are free again, unless their steps were
        handed over (or lent anew since)."""
        while True:
            try:
                slot, loan = self._dropped_loans.get_nowait()
            except queue.Empty:
                return
            if self._lent.get(slot) == loan and self._header is not None:
                del self._lent[slot]
                self._header[slot] = FREE

    def _lent_layout(self, step: Any) -> tuple[int, Any] | None:
        """(slot, layout) when every tensor of ``step`` lies in one lent slot, as gathered there."""
        base, slots = self._data.data_ptr(), set()

        def place(tensor: torch.Tensor) -> _InSlot | None:
            if tensor.nbytes == 0:
                return _InSlot(0, tuple(tensor.shape), tensor.dtype)
            start = tensor.data_ptr() - base
            slot = start // self._slot_bytes if start >= 0 else -1
            if (
                not tensor.is_contiguous()
                or slot not in self._lent
                or start + tensor.nbytes > (slot + 1) * self._slot_bytes
            ):
                slots.add(None)
                return None
            slots.add(slot)
            return _InSlot(start, tuple(tensor.shape), tensor.dtype)

        layout = map_leaves(step, torch.Tensor, place)
        if len(slots) != 1 or None in slots:
            return None
        return slots.pop(), layout

    def share(self, step: Any) -> Any:
        """``step`` as a slot of the ring: the one it was gathered in, else a free one it is copied into
        if it fits; else ``step`` itself."""
        needed = _step_bytes(step)
        if needed == 0:
            return step
        with self._lock:
            if self._memory is None:
                self._create(max(needed, self._largest_batch))
            if self._tracked and self._header[MAPPED]:
                self._untrack()
            lent = self._lent_layout(step)
            if lent is not None:
                slot, layout = lent
                del self._lent[slot]
                self._header[slot] = HELD
                return _SlotStep(self._memory.name, slot, layout)
            slot = self._free_slot()
            if needed > self._slot_bytes or slot is None:
                return step
            self._header[slot] = HELD
        offset = slot * self._slot_bytes

        def write(tensor: torch.Tensor) -> _InSlot:
            nonlocal offset
            start, offset = offset, offset + _aligned(tensor.nbytes)
            self._data[start : start + tensor.nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)
            return _InSlot(start, tuple(tensor.shape), tensor.dtype)

        return _SlotStep(self._memory.name, slot, map_leaves(step, torch.Tensor, write))


_NOT_A_STEP_YET = (
    "a DataLoader collate_fn got a step of snapfeed's to_torch() while it is still a handle to its loader "
    "worker's shared-memory slot (reader.outputs.shared_steps); leave collate_fn out (DataLoader(dataset, "
    "batch_size=None) needs none) and transform batches in map_fn=, which runs in the workers"
)


class _SlotStep:
    """What crosses the queue: the ring's name, the slot, and the step with ``_InSlot`` for tensors.

    Only the training process sees the step itself; in the worker (a
    ``collate_fn``) any use of it but pickling is refused with one error.
    """

    def __init__(self, ring: str, slot: int, layout: Any) -> None:
        self._args = (ring, slot, layout)

    def __reduce__(self):
        return _receive, self._args

    def _refuse(self, *args: Any) -> Any:
        raise TypeError(_NOT_A_STEP_YET)

    __getitem__ = __iter__ = __len__ = __contains__ = _refuse

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name if name.startswith("__") else f"{name!r}: {_NOT_A_STEP_YET}")


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
            nbytes = math.prod(place.shape) * place.dtype.itemsize
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
