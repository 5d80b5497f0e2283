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
#: Block reader threads: a core each but the one the batch-gathering thread keeps busy (it also runs reads
#: itself whenever it would otherwise wait for a window), at most 4. More threads than that do not add speed
#: but GIL hand-offs: each block read or decoded gives the GIL up and takes it back, and the gathering
#: thread waits behind them for it at the end of each ``take``. On a 16-core host, warm 3 KB rows read at
#: 0.86-1.12M rows/s with 15 threads, 1.27-1.38M with 4 and 1.33-1.60M with 2, against a NumPy gather's
#: 1.59-1.73M; 4 leave compressed shards' decoding (Arrow, GIL released) room to run on several cores.
AUTO_READER_THREADS = max(1, min(4, (os.cpu_count() or 2) - 1))
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


def _column_names(columns: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``columns="age"`` is the one column ``age`` (a string is a sequence of letters too)."""
    if columns is None:
        return None
    return (columns,) if isinstance(columns, str) else tuple(columns)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReaderOptions:
    """Everything that shapes what a reader yields (validated on construction).

    ``shuffle_buffer_size=None`` here means AUTO: the window is sized from the
    snapshot's row size when the reader opens it.
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
    num_reader_threads: int = AUTO_READER_THREADS
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
        window = None if isinstance(shuffle_buffer_size, str) else shuffle_buffer_size
        _auto_or_positive("shuffle_buffer_size", shuffle_buffer_size, 1)
        _auto_or_positive("cache_bytes", cache_bytes, 1)
        return cls(
            global_batch_size=global_batch_size,
            shard_policy=ShardPolicy.parse(shard_policy),
            shuffle_buffer_size=window,
            num_reader_threads=_auto_or_positive("num_reader_threads", num_reader_threads, cls.num_reader_threads),
            num_io_threads=_auto_or_positive("num_io_threads", num_io_threads, AUTO_IO_THREADS),
            read_ahead_bytes=_auto_or_positive("read_ahead_bytes", read_ahead_bytes, AUTO_READ_AHEAD_BYTES),
            reader_buffer_size=_auto_or_positive("reader_buffer_size", reader_buffer_size, AUTO_WINDOWS_AHEAD),
            prefetch=_auto_or_positive("prefetch", prefetch, AUTO_PREFETCH_STEPS),
            columns=_column_names(columns),
            cache_bytes=None if isinstance(cache_bytes, str) else _auto_or_positive("cache_bytes", cache_bytes, 1),
            **fixed,
        )
