"""Where a batch's memory comes from: fresh arrays by default, kept for the next batch by glibc.

The gatherer takes every new batch's arrays from a ``BatchAllocator``
(``new_batch``, ``np.empty`` per column, unless the pipeline was given
another): a DataLoader worker hands out slots of its shared-memory ring
instead, so its steps cross to the training process without a copy
(``reader.outputs.shared_steps``).

Every batch is a fresh array of megabytes, allocated on the prefetch thread
and freed on the training thread. With glibc's defaults such a block is handed
back to the kernel when freed (unmapped, or trimmed off its thread's heap) and
the next batch page-faults all of it in again: on the reader bench that was
about 100 faults per 1,000 rows and a third of the reader's time. Fixing the
mmap threshold at its maximum and the trim threshold just above it makes glibc
reuse the freed blocks, as it does on its own for single-threaded programs.

The setting is process-wide, so it is made once, the first time a reader
pipeline runs; ``SNAPFEED_TUNE_MALLOC=0`` leaves glibc's defaults alone. Other
allocators (jemalloc, tcmalloc, musl) are not touched.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable

import numpy as np

#: A batch, a window or a piece of one: an equally long NumPy array per column name.
Columns = dict[str, np.ndarray]
#: ``allocate(rows, empty_batch)``: arrays of ``rows`` rows shaped and typed as ``empty_batch``'s columns.
BatchAllocator = Callable[[int, Columns], Columns]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc's largest allowed mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
MMAP_THRESHOLD_BYTES = 32 << 20
#: Free memory at the top of a heap is returned to the kernel beyond this.
TRIM_THRESHOLD_BYTES = 64 << 20


@functools.cache
def keep_freed_batches() -> bool:
    """Sets the thresholds (once); True when glibc accepted them."""
    if os.environ.get("SNAPFEED_TUNE_MALLOC", "1") == "0":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False  # not glibc
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))


def new_batch(rows: int, empty_batch: Columns) -> Columns:
    """The default ``BatchAllocator``: fresh (uninitialized) arrays."""
    return {name: np.empty((rows, *empty.shape[1:]), empty.dtype) for name, empty in empty_batch.items()}
