"""The reader's options: one frozen, validated object shared by every output and the service."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

from reader.core.cache import ShardCache, for_options, resolve_dir
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
#: AUTO block reader threads (``auto_reader_threads``) for rows under ``LARGE_ROW_BYTES``: one thread gathering
#: from the windows bounds small rows, and more block threads only add GIL hand-offs (docs/architecture.md §9.2).
SMALL_ROW_READER_THREADS = 2
#: AUTO block reader threads for large rows: each row is read by its own ``preadv`` straight into the batch
#: (``reader.core.batch.DirectWindow``), so the kernel's copies run on as many cores as there are threads (§9.2).
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


def _auto_or_positive(name: str, value: int | str, auto: int) -> int:
    if isinstance(value, str):
        if value.upper() != AUTO:
            raise UsageError(f"{name}={value!r}; give a positive integer or 'AUTO'")
        return auto
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{name}={value!r}; give a positive integer or 'AUTO'")
    return value


def _none_if_auto(name: str, value: int | str) -> int | None:
    """A positive integer as given, or None for 'AUTO' or None (sized when the reader opens its snapshot)."""
    if value is None:
        return None
    checked = _auto_or_positive(name, value, 1)
    return None if isinstance(value, str) else checked


def _column_names(columns: str | Sequence[str] | None) -> tuple[str, ...] | None:
    """``columns="age"`` is the one column ``age`` (a string is a sequence of letters too)."""
    if columns is None:
        return None
    return (columns,) if isinstance(columns, str) else tuple(columns)


def _set(options: object, name: str, value: object) -> None:
    """A frozen group keeps the value its ``__post_init__`` resolved (``AUTO`` → a number, a string → a tuple)."""
    object.__setattr__(options, name, value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReadOptions:
    """How the local reader reads a snapshot's blocks: its threads, what it reads ahead, what it checks.

    Every size may be ``"AUTO"``, the default; docs/reading.md "Speed" says
    what each one trades. With ``service=`` the workers read the blocks, so
    only ``verify_checksums`` applies (they check what it says before they send).

    Args:
        num_reader_threads: threads that read and decode blocks; AUTO: from the row size (``auto_reader_threads``).
        num_io_threads: threads with reads in flight (an object store's round trips); AUTO: 32.
        read_ahead_bytes: bytes of blocks read ahead of the windows being gathered; AUTO: 128 MiB.
        reader_buffer_size: shuffle windows loaded ahead of the one being gathered; AUTO: 1.
        prefetch: steps gathered ahead of the consumer; AUTO: 4.
        verify_checksums: False (sizes only), ``"blocks"`` (each block's CRC32C when this process first reads
            it) or True (each whole shard's before its first block): ``reader.core.block_checks`` says what each costs.
    """

    num_reader_threads: int | str | None = AUTO
    num_io_threads: int | str = AUTO
    read_ahead_bytes: int | str = AUTO
    reader_buffer_size: int | str = AUTO
    prefetch: int | str = AUTO
    verify_checksums: bool | str = False

    def __post_init__(self) -> None:
        _set(self, "num_reader_threads", _none_if_auto("num_reader_threads", self.num_reader_threads))
        _set(self, "num_io_threads", _auto_or_positive("num_io_threads", self.num_io_threads, AUTO_IO_THREADS))
        _set(
            self,
            "read_ahead_bytes",
            _auto_or_positive("read_ahead_bytes", self.read_ahead_bytes, AUTO_READ_AHEAD_BYTES),
        )
        _set(
            self,
            "reader_buffer_size",
            _auto_or_positive("reader_buffer_size", self.reader_buffer_size, AUTO_WINDOWS_AHEAD),
        )
        _set(self, "prefetch", _auto_or_positive("prefetch", self.prefetch, AUTO_PREFETCH_STEPS))
        if self.verify_checksums not in VERIFY_CHECKSUMS or not isinstance(self.verify_checksums, bool | str):
            raise UsageError(
                f"verify_checksums={self.verify_checksums!r}; choose False (sizes only), 'blocks' (each block's "
                f"CRC32C when this process first reads it) or True (each whole shard's before its first block)"
            )

    def tuning_given(self) -> dict[str, object]:
        """The sizes set to other than AUTO, by name: what tunes the local reader (``verify_checksums`` aside)."""
        auto = ReadOptions(verify_checksums=self.verify_checksums)
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != getattr(auto, field.name)
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheOptions:
    """A local directory that keeps the shards of a bucket snapshot for later epochs (``reader.core.cache.shard_cache``).

    Shared by the processes of a host, each byte downloaded once; a service
    worker takes the same options (``--cache_dir``, ``--cache_bytes``).
    docs/reading.md "Caching bucket shards".

    Args:
        dir: the directory, or ``"auto"`` (``$SNAPFEED_CACHE_DIR``, else ``~/.cache/snapfeed``); None: no cache.
        max_bytes: the cache's budget; AUTO: 64 GiB, or half the disk's free space when that is less.
    """

    dir: str | None = None
    max_bytes: int | str | None = AUTO

    def __post_init__(self) -> None:
        resolve_dir(self.dir)  # names a dir= that cannot be one
        if self.max_bytes is not None and not (isinstance(self.max_bytes, str) and self.max_bytes.upper() == AUTO):
            if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes < 1:
                raise UsageError(f"max_bytes={self.max_bytes!r}; give a positive number of bytes, or 'AUTO'")
        _set(self, "max_bytes", None if isinstance(self.max_bytes, str) else self.max_bytes)
        if self.max_bytes is not None and self.dir is None:
            raise UsageError(
                f"max_bytes={self.max_bytes} (--cache_bytes) is the budget of a cache directory; give dir= (--cache_dir) too"
            )

    def open(self) -> ShardCache | None:
        """The cache these options name (one per directory and budget in a process), or None without ``dir``."""
        return for_options(self.dir, self.max_bytes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReaderOptions:
    """Everything that shapes what a reader yields, validated on construction: internal, composed by
    ``reader.distributed_dataset`` from its arguments and its ``read=``/``cache=`` groups.

    ``shuffle_buffer_size=None`` (or AUTO) and ``read.num_reader_threads=None``
    mean AUTO: the window and the block threads are sized from the snapshot's
    row size when the reader opens it.
    """

    global_batch_size: int
    context: InputContext = InputContext()
    shard_policy: ShardPolicy | str = ShardPolicy.AUTO
    shuffle: bool = True
    seed: int | None = None
    shuffle_buffer_size: int | str | None = None
    reshuffle_each_epoch: bool = True
    num_epochs: int | None = 1
    drop_remainder: bool = False
    columns: str | Sequence[str] | None = None
    output: str = "numpy"
    read: ReadOptions = ReadOptions()
    cache: CacheOptions = CacheOptions()

    def __post_init__(self) -> None:
        if isinstance(self.global_batch_size, bool) or not isinstance(self.global_batch_size, int):
            raise UsageError(f"global_batch_size={self.global_batch_size!r}; give an integer >= 1")
        if self.global_batch_size < 1:
            raise UsageError(f"global_batch_size={self.global_batch_size}; it must be at least 1")
        if self.output not in OUTPUTS:
            raise UsageError(f"output={self.output!r}; choose one of {', '.join(OUTPUTS)}")
        if self.num_epochs is not None and (not isinstance(self.num_epochs, int) or self.num_epochs < 1):
            raise UsageError(f"num_epochs={self.num_epochs!r}; give a positive integer, or None to repeat forever")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise UsageError(f"seed={self.seed!r}; give a non-negative integer or None")
        _set(self, "shard_policy", ShardPolicy.parse(self.shard_policy))
        if self.shuffle_buffer_size is not None:
            _set(self, "shuffle_buffer_size", _none_if_auto("shuffle_buffer_size", self.shuffle_buffer_size))
        _set(self, "columns", _column_names(self.columns))
        if self.columns is not None and not self.columns:
            raise UsageError("columns=[] selects nothing; pass None for every column")
        for group, kind in (("read", ReadOptions), ("cache", CacheOptions)):
            if not isinstance(getattr(self, group), kind):
                raise UsageError(f"{group}={getattr(self, group)!r}; give a reader.{kind.__name__}(...)")
