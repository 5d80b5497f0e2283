"""The reader's options: one frozen, validated object shared by every output and the service."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from reader.core import shard_cache
from reader.core.plan import InputContext, ShardPolicy
from schemas.errors import UsageError

OUTPUTS = ("numpy", "tf", "torch", "jax")
VERIFY_CHECKSUMS = (False, "blocks", True)
AUTO = "AUTO"
#: AUTO shuffle window: rows adding up to about this many decoded bytes.
AUTO_WINDOW_BYTES = 32 << 20
#: Rows at least this large are copied into their batch slot one by one (``reader.core.batch``): the
#: per-row call is noise next to the copy.
LARGE_ROW_BYTES = 32 << 10
AUTO_PREFETCH_STEPS = 4
AUTO_WINDOWS_AHEAD = 1
#: AUTO block reader threads (``auto_reader_threads``) for rows under ``LARGE_ROW_BYTES``. Small rows are
#: read a block at a time into their window's buffer and gathered from there by one thread, which is what
#: bounds them; every block read or decoded gives the GIL up and takes it back, and the gathering thread
#: waits behind the block threads for it at the end of each ``take``, so more threads add hand-offs, not
#: speed. On a 16-core host (``bench.reader_bench``, 3 KB rows, NumPy gather 1.59-2.04M rows/s) 2 threads
#: read 1.32-1.48M rows/s (0.78-0.88x the gather, 5 runs), 4 read 0.99-1.43M (0.62-0.83x, 5 runs) and 15
#: 1.21-1.27M (0.61-0.67x); LZ4 shards read as fast with 2 as with 4 (0.56-0.58M rows/s).
SMALL_ROW_READER_THREADS = 2
#: AUTO block reader threads for large rows: each row is read by its own ``preadv`` straight into the batch
#: (``reader.core.batch.DirectWindow``), spread over the block threads, so the kernel's copies run on as many
#: cores as there are threads. On the 16-core host 150 KB rows read 30.8-31.4k rows/s with 15 threads
#: (1.31-1.58x a NumPy gather) and 20.9-26.0k with 4 (1.01-1.22x).
LARGE_ROW_READER_THREADS = 16


def auto_reader_threads(row_bytes: int, cores: int | None = None) -> int:
    """AUTO ``num_reader_threads`` for rows of ``row_bytes``: a core each but the one the batch-gathering
    thread keeps busy (it also reads blocks itself whenever it would otherwise wait for a window), at most
    ``SMALL_ROW_READER_THREADS`` or ``LARGE_ROW_READER_THREADS``."""
    cap = LARGE_ROW_READER_THREADS if row_bytes >= LARGE_ROW_BYTES else SMALL_ROW_READER_THREADS
    return max(1, min(cap, (cores or os.cpu_count() or 2) - 1))


#: Block I/O threads (``reader.core.block_io``): sized for requests in flight, not for cores. They mostly
#: wait (an object store's round trip is tens of milliseconds; a cold disk serves many reads at once),
#: so their number is what a store needs outstanding to deliver its bandwidth.
AUTO_IO_THREADS = 32
#: Bytes of blocks read ahead of the windows being loaded: fetched blocks (compressed or remote shards)
#: are held in memory until decoded, direct ones (local, uncompressed) are read by the kernel into the
#: page cache. At 1 GB/s and a 20 ms round trip 20 MB are in flight; this keeps every I/O thread busy
#: with coalesced reads of 4 MiB.
AUTO_READ_AHEAD_BYTES = 128 << 20


#: Options of local reads: with ``service=`` the workers read the blocks, the job's seeded order
#: shuffles them (every epoch anew) and ``processing_mode`` decides what each consumer gets.
LOCAL_ONLY = (
    "shard_policy",
    "shuffle",
    "shuffle_buffer_size",
    "reshuffle_each_epoch",
    "num_reader_threads",
    "num_io_threads",
    "read_ahead_bytes",
    "reader_buffer_size",
    "prefetch",
    "cache_dir",
    "cache_bytes",
)


def _auto_or_positive(name: str, value: int | str, auto: int) -> int:
    if isinstance(value, str):
        if value.upper() != AUTO:
            raise UsageError(f"{name}={value!r}; give a positive integer or 'AUTO'")
        return auto
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name}={value!r}; give a positive integer or 'AUTO'")
    return value


def _none_if_auto(name: str, value: int | str) -> int | None:
    """A positive integer as given, or None for 'AUTO' (sized when the reader opens its snapshot)."""
    checked = _auto_or_positive(name, value, 1)
    return None if isinstance(value, str) else checked


def _column_names(columns: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``columns="age"`` is the one column ``age`` (a string is a sequence of letters too)."""
    if columns is None:
        return None
    return (columns,) if isinstance(columns, str) else tuple(columns)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReaderOptions:
    """Everything that shapes what a reader yields (validated on construction).

    ``shuffle_buffer_size=None`` and ``num_reader_threads=None`` here mean AUTO:
    the window and the block threads are sized from the snapshot's row size when
    the reader opens it.
    """

    global_batch_size: int
    context: InputContext = InputContext()
    shard_policy: ShardPolicy = ShardPolicy.AUTO
    shuffle: bool = True
    seed: int | None = None
    shuffle_buffer_size: int | None = None
    reshuffle_each_epoch: bool = True
    num_epochs: int | None = 1
    drop_remainder: bool = False
    columns: tuple[str, ...] | None = None
    num_reader_threads: int | None = None  # None: AUTO, from the row size (auto_reader_threads)
    num_io_threads: int = AUTO_IO_THREADS
    read_ahead_bytes: int = AUTO_READ_AHEAD_BYTES
    reader_buffer_size: int = AUTO_WINDOWS_AHEAD
    prefetch: int = AUTO_PREFETCH_STEPS
    verify_checksums: bool | str = False  # False | "blocks" | True: reader.core.block_checks says what each costs
    output: str = "numpy"
    #: A local directory (or "auto") keeping bucket shards for later epochs: reader.core.shard_cache.
    cache_dir: str | None = None
    cache_bytes: int | None = None  # the cache's budget; None: AUTO (shard_cache.auto_budget)

    def __post_init__(self) -> None:
        if isinstance(self.global_batch_size, bool) or not isinstance(self.global_batch_size, int):
            raise UsageError(f"global_batch_size={self.global_batch_size!r}; give an integer >= 1")
        if self.global_batch_size < 1:
            raise UsageError(f"global_batch_size={self.global_batch_size}; it must be at least 1")
        if self.verify_checksums not in VERIFY_CHECKSUMS or not isinstance(self.verify_checksums, bool | str):
            raise UsageError(
                f"verify_checksums={self.verify_checksums!r}; choose False (sizes only), 'blocks' (each block's "
                f"CRC32C when this process first reads it) or True (each whole shard's before its first block)"
            )
        if self.output not in OUTPUTS:
            raise UsageError(f"output={self.output!r}; choose one of {', '.join(OUTPUTS)}")
        if self.num_epochs is not None and (not isinstance(self.num_epochs, int) or self.num_epochs < 1):
            raise UsageError(f"num_epochs={self.num_epochs!r}; give a positive integer, or None to repeat forever")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise UsageError(f"seed={self.seed!r}; give a non-negative integer or None")
        if self.columns is not None and not self.columns:
            raise UsageError("columns=[] selects nothing; pass None for every column")
        shard_cache.resolve_dir(self.cache_dir)  # names a cache_dir= that cannot be one

    def local_only_given(self) -> dict[str, object]:
        """The options of local reads (``LOCAL_ONLY``) set to other than their defaults, by name."""
        given = {name: getattr(self, name) for name in LOCAL_ONLY}
        return {name: value for name, value in given.items() if value != getattr(ReaderOptions, name)}

    @classmethod
    def build(
        cls,
        global_batch_size: int,
        *,
        shard_policy: str | ShardPolicy,
        shuffle_buffer_size: int | str,
        num_reader_threads: int | str,
        num_io_threads: int | str,
        read_ahead_bytes: int | str,
        reader_buffer_size: int | str,
        prefetch: int | str,
        columns: str | Sequence[str] | None,
        cache_bytes: int | str = AUTO,
        **fixed,
    ) -> ReaderOptions:
        """From the public keyword arguments, where sizes may be 'AUTO'.

        Every argument is given (``reader.distributed_dataset`` passes them
        all): the defaults a user sees are spelled once, in that signature,
        which takes the plain ones from this class's fields.
        """
        return cls(
            global_batch_size=global_batch_size,
            shard_policy=ShardPolicy.parse(shard_policy),
            shuffle_buffer_size=_none_if_auto("shuffle_buffer_size", shuffle_buffer_size),
            num_reader_threads=_none_if_auto("num_reader_threads", num_reader_threads),
            num_io_threads=_auto_or_positive("num_io_threads", num_io_threads, AUTO_IO_THREADS),
            read_ahead_bytes=_auto_or_positive("read_ahead_bytes", read_ahead_bytes, AUTO_READ_AHEAD_BYTES),
            reader_buffer_size=_auto_or_positive("reader_buffer_size", reader_buffer_size, AUTO_WINDOWS_AHEAD),
            prefetch=_auto_or_positive("prefetch", prefetch, AUTO_PREFETCH_STEPS),
            columns=_column_names(columns),
            cache_bytes=_none_if_auto("cache_bytes", cache_bytes),
            **fixed,
        )
