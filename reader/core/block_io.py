"""Block reads as few, large, concurrent positioned reads: what cold disks and object stores need.

A window's blocks are scattered over the shards (the epoch's piece
permutation), so reading them one at a time leaves a cold disk idle between
requests and pays an object store's round trip (tens of milliseconds) per
block. Here each shard's footer is read once (``reader.core.ipc_layout``), the byte
ranges of the blocks a window needs are merged where they are adjacent or
nearly so (``coalesce``), and the merged ranges are read with ``read_at`` on an
I/O pool sized for outstanding requests, not for cores. Decoding stays with the
caller (``decode_block``), on the threads that have the cores.

``read_at`` on ``schemas.storage.open_random_access`` files is a ``pread`` on
local disk and one ranged GET on ``s3://`` and ``gs://`` (through
``pyarrow.fs``), and is safe to call from many threads at once.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
from collections.abc import Callable, Iterable, Sequence

import pyarrow as pa
import pyarrow.ipc as ipc

from reader.core import fork_safe, ipc_layout
from reader.core.ipc_layout import BlockRange, ShardLayout

#: Largest merged read. Object stores serve ranged GETs of 8-16 MiB at full per-connection speed and
#: the request's round trip is then under a tenth of its transfer; larger reads only delay the first
#: block in them and hold more memory per request.
COALESCE_BYTES = 16 << 20
#: Ranges this close are read as one, the gap with them: on an object store a gap this size costs a
#: few milliseconds of transfer against a round trip of tens; on a disk, less than a seek.
COALESCE_GAP_BYTES = 256 << 10
#: The footer is usually found in one read of the file's tail this long (a shard of 256 blocks has a
#: footer of about 7 KB); a longer one costs a second read.
TAIL_BYTES = 64 << 10

BlockKey = tuple[int, int]  # (shard, block)


def coalesce(ranges: Iterable[tuple[int, int]], *, max_bytes: int, max_gap: int) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges of one file merged, in file order: neighbours no more than ``max_gap``
    apart join while the merged range stays within ``max_bytes`` (a longer range stays whole)."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if merged:
            first, last = merged[-1]
            if start - last <= max_gap and max(stop, last) - first <= max_bytes:
                merged[-1] = (first, max(stop, last))
                continue
        merged.append((start, stop))
    return merged


def read_layout(file, size: int) -> ShardLayout:
    """A shard's blocks from its footer: one read of the file's tail (two for a long footer).

    Raises ``ValueError`` (saying what is wrong) for a file that is not a whole Arrow IPC file.
    """
    tail_bytes = min(size, TAIL_BYTES)
    if tail_bytes < ipc_layout.TRAILER_BYTES + 8:
        raise ValueError(f"it has {size} bytes, too few for an Arrow IPC file")
    tail = read_exactly(file, size - tail_bytes, tail_bytes)
    footer_bytes = ipc_layout.footer_length(tail[-ipc_layout.TRAILER_BYTES :])
    footer_offset = size - ipc_layout.TRAILER_BYTES - footer_bytes
    if footer_offset < 8:
        raise ValueError(f"its footer length {footer_bytes} does not fit in {size} bytes")
    if footer_bytes + ipc_layout.TRAILER_BYTES <= tail_bytes:
        footer = memoryview(tail)[tail_bytes - ipc_layout.TRAILER_BYTES - footer_bytes : -ipc_layout.TRAILER_BYTES]
    else:
        footer = memoryview(read_exactly(file, footer_offset, footer_bytes))
    return ipc_layout.parse_footer(footer, footer_offset)


class ShortReadError(ValueError):
    """The file ended before a range that its footer or the manifest says is there."""

    def __init__(self, offset: int, wanted: int, got: int) -> None:
        super().__init__(f"ends at byte {offset + got}, short of {wanted} bytes read from byte {offset}")
        self.end = offset + got


def read_exactly(file, offset: int, length: int, into: pa.Buffer | None = None) -> pa.Buffer:
    """``length`` bytes from ``offset``: positioned reads (GIL released), into ``into`` when given.

    Through a segment stream rather than ``read_at``, which reads into a new Python bytes object
    from malloc: there, buffers freed by 32 threads stayed in glibc's per-thread arenas (hundreds
    of MB of RSS once the reader's trim threshold applies). ``Fetch`` allocates its buffers on the
    thread that plans the reads, so the I/O threads allocate nothing and freed buffers are reused.
    """
    buffer = into if into is not None else pa.allocate_buffer(length)
    view = memoryview(buffer)
    stream, done = file.get_stream(offset, length), 0
    while done < length:
        got = stream.readinto(view[done:])
        if not got:
            raise ShortReadError(offset, length, done)
        done += got
    return buffer


@functools.cache
def _fetch_memory_pool() -> pa.MemoryPool:
    """jemalloc where pyarrow has it (its wheels do): its freed pages are reused for the next fetch.

    Fetched blocks are allocated and freed at the rate blocks are read (GB/s); Arrow's default pool,
    mimalloc, kept about 100 MB of them past their use on the reader bench (its delayed purge),
    jemalloc and glibc without the reader's malloc tuning a few MB.
    """
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.default_memory_pool()


class FetchBuffers:
    """Buffers of merged reads, reused once every use of one was copied out of it (``Fetch.copied``).

    A fresh buffer per read meant fresh pages per read: jemalloc hands large freed blocks back to the
    kernel at once, so every GET wrote into pages the kernel had to fault in and zero. On the remote
    bench that was 98% of the reader's page faults (the GCS client's copy into the buffer), about a
    tenth of its CPU. Buffers are made in size classes (``capacity``: a snapshot's blocks are about
    equally long, and share one), and at most ``keep_bytes`` of them are kept; 0 keeps none.
    """

    def __init__(self, keep_bytes: int) -> None:
        self._keep_bytes = keep_bytes
        self._kept_bytes = 0
        self._kept: dict[int, list[pa.Buffer]] = {}
        self._lock = fork_safe.Lock()  # shared by the pipeline's passes, in a forked child too

    @property
    def kept_bytes(self) -> int:
        return self._kept_bytes

    @staticmethod
    def capacity(size: int) -> int:
        """``size`` rounded up to its class, whole pages: at most an eighth more, or under a page more, so
        what the reads ahead hold stays near ``read_ahead_bytes`` however small the blocks."""
        step = max(4096, (1 << (size.bit_length() - 1)) >> 3) if size else 4096
        return -(-size // step) * step

    def take(self, size: int) -> pa.Buffer:
        """A buffer of at least ``size`` bytes: a kept one of its size class, else a new one."""
        capacity = self.capacity(size) if self._keep_bytes else size
        with self._lock:
            kept = self._kept.get(capacity)
            if kept:
                self._kept_bytes -= capacity
                return kept.pop()
        return pa.allocate_buffer(capacity, memory_pool=_fetch_memory_pool())

    def give_back(self, buffer: pa.Buffer) -> None:
        """Keeps ``buffer`` for a later read, unless that would keep more than ``keep_bytes``."""
        with self._lock:
            if self._kept_bytes + buffer.size <= self._keep_bytes:
                self._kept.setdefault(buffer.size, []).append(buffer)
                self._kept_bytes += buffer.size


def decode_block(message: pa.Buffer, schema: pa.Schema) -> pa.RecordBatch:
    """A block from its message bytes (header and body): zero-copy when uncompressed, GIL released."""
    return ipc.read_record_batch(ipc.read_message(message), schema)


class _Range:
    """One merged read in flight, and how many block reads still need its bytes."""

    __slots__ = ("buffer", "copies_left", "deferred", "future", "size", "start", "users")

    def __init__(self, future: concurrent.futures.Future, start: int, size: int, users: int, buffer: pa.Buffer) -> None:
        self.future: concurrent.futures.Future | None = future
        self.start = start
        self.size = size
        self.users = users
        self.copies_left = users  # uses not yet copied out: at 0 the buffer is reused
        self.buffer: pa.Buffer | None = buffer
        self.deferred: tuple | None = None  # read_exactly's arguments, when the first taker reads it


class Fetch:
    """Coalesced reads of some blocks, started on an I/O pool in the order the blocks are needed.

    ``blocks`` lists each block once per use (a block two pieces need is
    listed twice); ``take`` gives one use its bytes, and a merged read's
    memory is let go as soon as its last use took them, so what a fetch holds
    shrinks as the blocks are decoded. A merged read whose first byte
    ``cached(shard, offset)`` says is in the page cache is not handed to the
    pool: its first taker reads it (a copy from memory, cheaper than the
    hand-off). Buffers come from ``buffers`` and go back to it once every use of one said it was
    ``copied`` out of it; a use that keeps its bytes never says so, and its buffer is let go as usual.
    """

    def __init__(
        self,
        blocks: Sequence[tuple[BlockKey, BlockRange]],
        file: Callable[[int], object],
        pool: concurrent.futures.Executor,
        *,
        max_bytes: int = COALESCE_BYTES,
        max_gap: int = COALESCE_GAP_BYTES,
        cached: Callable[[int, int], bool] | None = None,
        buffers: FetchBuffers | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._buffers = buffers or FetchBuffers(0)
        self._where: dict[BlockKey, tuple[_Range, BlockRange]] = {}
        self._ranges: list[_Range] = []
        self.bytes = 0
        self._held = 0
        first_use: dict[BlockKey, int] = {}
        uses: dict[BlockKey, int] = {}
        per_shard: dict[int, dict[BlockKey, BlockRange]] = {}
        for index, (key, span) in enumerate(blocks):
            first_use.setdefault(key, index)
            uses[key] = uses.get(key, 0) + 1
            per_shard.setdefault(key[0], {})[key] = span
        planned = []  # (first use of any block in it, shard, start, stop, keys)
        for shard, spans in per_shard.items():
            keys = sorted(spans, key=lambda k: spans[k].offset)
            merged = coalesce([(spans[k].offset, spans[k].end) for k in keys], max_bytes=max_bytes, max_gap=max_gap)
            members = iter(keys)
            for start, stop in merged:  # the blocks, in file order, fall into the merged ranges in order
                inside = []
                for key in members:
                    inside.append(key)
                    if spans[key].end >= stop:
                        break
                planned.append((min(first_use[k] for k in inside), shard, start, stop, inside, spans))
        for _, shard, start, stop, inside, spans in sorted(planned, key=lambda plan: plan[0]):
            buffer = self._buffers.take(stop - start)  # here, not on an I/O thread
            arguments = (file(shard), start, stop - start, buffer)
            deferred = cached is not None and cached(shard, start)
            future = concurrent.futures.Future() if deferred else pool.submit(read_exactly, *arguments)
            merged_range = _Range(future, start, stop - start, sum(uses[k] for k in inside), buffer)
            merged_range.deferred = arguments if deferred else None
            self._ranges.append(merged_range)
            self.bytes += stop - start
            for key in inside:
                self._where[key] = (merged_range, spans[key])
        self._held = self.bytes

    @property
    def requests(self) -> int:
        return len(self._ranges)

    def __contains__(self, key: BlockKey) -> bool:
        return key in self._where

    @property
    def held_bytes(self) -> int:
        """Bytes of merged reads that some use has not taken yet (in flight, or read and waiting)."""
        return self._held

    def take(self, key: BlockKey, *, copied_after: bool = False) -> pa.Buffer:
        """One use's bytes of block ``key`` (header and body), waiting for its read; raises what the read raised.

        ``copied_after``: the caller copies them out and then says so (``copied``); a use that does not
        may keep them, so its merged read's buffer is never reused.
        """
        merged, span = self._where[key]
        future = merged.future
        if future is None:
            raise RuntimeError(f"block {key} was taken more often than it was fetched for")
        try:
            if merged.deferred is not None:
                self._read_deferred(merged, future)
            data = future.result()
        finally:
            with self._lock:
                merged.users -= 1
                if not copied_after:
                    merged.buffer = None
                if merged.users == 0:
                    merged.future = None  # the last use: the merged read's memory goes with the slice's
                    self._held -= merged.size
        return data.slice(span.offset - merged.start, span.length)

    def copied(self, key: BlockKey) -> None:
        """One use of block ``key``, taken with ``copied_after``, was copied out and nothing refers to its
        bytes any more: once every use of its merged read was, that read's buffer is reused."""
        merged, _ = self._where[key]
        with self._lock:
            merged.copies_left -= 1
            buffer = merged.buffer if merged.copies_left == 0 else None
            if buffer is not None:
                merged.buffer = None
        if buffer is not None:
            self._buffers.give_back(buffer)

    def _read_deferred(self, merged: _Range, future: concurrent.futures.Future) -> None:
        """Reads a deferred range in this thread, unless another taker does or it was cancelled."""
        with self._lock:
            arguments, merged.deferred = merged.deferred, None
            mine = arguments is not None and future.set_running_or_notify_cancel()
        if mine:
            try:
                future.set_result(read_exactly(*arguments))
            except BaseException as exc:  # noqa: BLE001 - it is the read's outcome, raised by result()
                future.set_exception(exc)

    def cancel(self) -> None:
        """Drops the reads not started yet (a read under way finishes on its own)."""
        for merged in self._ranges:
            if merged.future is not None:
                merged.future.cancel()
