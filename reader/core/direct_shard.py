"""An uncompressed shard read straight into NumPy memory: where each column's bytes lie, and positioned reads.

In a block of an uncompressed shard every fixed-width column (numbers and
fixed-shape tensors without nulls) is one contiguous run of bytes in the file,
so a row of a column is ``row_bytes`` bytes at a known file offset, and no
Arrow decode is needed to get at it. Where each run starts is read from the
block's IPC header (``reader.core.ipc_layout``, by ``reader.core.blocks``);
this module holds those extents and reads rows at them with ``preadv``.

The file read is a local shard (a snapshot's own, or a cache entry:
``LocalShardFile``) or a bucket shard still downloading into the cache
(``reader.core.cache.shard_fill.Filling``): both answer the same three questions,
positioned reads that may wait, positioned reads that never wait, and a hint
that some bytes will be read soon.

A shard truncated under a running reader is a ``CorruptSnapshotError`` naming
it (a read comes back short), never a crash.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from reader.core.allocator import Columns
from reader.core.plan import Piece
from schemas.errors import CorruptSnapshotError


@dataclasses.dataclass(frozen=True)
class ColumnExtent:
    """Where a column of one block lies in the shard: row ``i`` at ``offset + i * row_bytes``."""

    offset: int
    row_bytes: int


@dataclasses.dataclass(frozen=True)
class BlockExtents:
    rows: int
    columns: dict[str, ColumnExtent]


class ShardFile(Protocol):
    """What direct reads read from: a local file, or a download landing in one."""

    def pread(self, destination: memoryview, offset: int) -> int:
        """Reads up to ``len(destination)`` bytes at ``offset``, waiting for them; 0 at the end of the file."""

    def pread_now(self, destination: memoryview, offset: int) -> int:
        """Reads what is there now without waiting (the page cache, landed chunks); 0 when it would wait."""

    def will_need(self, offset: int, length: int) -> None:
        """A hint: these bytes are read soon (a read of them names what fails)."""


_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
_nowait_refused = False  # the kernel or filesystem refused RWF_NOWAIT once: every read is handed over


def _cached_reads_work() -> bool:
    return bool(_NOWAIT) and not _nowait_refused


def pread_nowait(fd: int, destination: memoryview, offset: int) -> int:
    """One ``preadv`` with ``RWF_NOWAIT``: what the page cache holds from ``offset`` on, without waiting for
    the disk (the kernel starts reading ahead where it stops); 0 when nothing is cached or at the end of the
    file (the blocking read names the shard)."""
    global _nowait_refused
    if not _cached_reads_work():
        return 0
    try:
        return os.preadv(fd, [destination], offset, _NOWAIT)
    except BlockingIOError:
        return 0
    except OSError:
        _nowait_refused = True  # EOPNOTSUPP/EINVAL: no such flag here; the I/O pool reads it all
        return 0


class LocalShardFile:
    """A local shard file: ``preadv``, the page cache asked with ``RWF_NOWAIT``, the kernel told to read ahead."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 - lives as long as the shard is read

    def pread(self, destination: memoryview, offset: int) -> int:
        return os.preadv(self._file.fileno(), [destination], offset)

    def pread_now(self, destination: memoryview, offset: int) -> int:
        return pread_nowait(self._file.fileno(), destination, offset)

    def will_need(self, offset: int, length: int) -> None:
        """``POSIX_FADV_WILLNEED`` when the range's first byte is not in the page cache (a one-byte
        ``RWF_NOWAIT`` read asks: warm, that read is all this costs)."""
        if (
            hasattr(os, "posix_fadvise")
            and _cached_reads_work()
            and not self.pread_now(memoryview(bytearray(1)), offset)
        ):
            os.posix_fadvise(self._file.fileno(), offset, length, os.POSIX_FADV_WILLNEED)


class DirectShard:
    """One uncompressed shard, open for positioned reads, with where each column of each block lies.

    ``blocks[i]`` is block ``i``'s extents, or None when that block is not
    plain runs of bytes (it is decoded by Arrow instead). ``path`` names the
    shard in errors.
    """

    def __init__(self, path: str, file: ShardFile, blocks: Sequence[BlockExtents | None]) -> None:
        self.path = path
        self.file = file
        self.blocks = blocks

    def row_offsets(self, name: str, piece: Piece) -> np.ndarray:
        extent = self.blocks[piece.block].columns[name]
        return extent.offset + np.arange(piece.start, piece.stop, dtype=np.int64) * extent.row_bytes

    def read_piece_into(self, piece: Piece, out: Columns) -> None:
        """Fills ``out`` (one array of ``piece.rows`` rows per column) with the piece: a read per column."""
        for name, values in out.items():
            extent = self.blocks[piece.block].columns[name]
            # cast() refuses a non-contiguous array instead of reading into a copy of it
            self.read_into(memoryview(values).cast("B"), extent.offset + piece.start * extent.row_bytes)

    def read_into(self, destination: memoryview, offset: int) -> None:
        """Fills ``destination`` with the shard's bytes from ``offset`` (positioned reads, GIL released)."""
        while destination:
            done = self.file.pread(destination, offset)
            if done == 0:
                raise CorruptSnapshotError(
                    f"shard {self.path} ends at byte {offset}, short of a row the manifest lists; "
                    f"run `snapfeed verify` on the snapshot"
                )
            destination, offset = destination[done:], offset + done

    def read_now(self, destination: memoryview, offset: int) -> tuple[memoryview, int]:
        """Copies what is readable without waiting into ``destination``; returns what is left to read."""
        while destination and (done := self.file.pread_now(destination, offset)):
            destination, offset = destination[done:], offset + done
        return destination, offset


class HeaderExtents:
    """A direct shard's block extents, each read from its block's header the first time it is asked for.

    ``read(index)`` reads block ``index``'s header and finds its extents (``reader.core.blocks``, which knows
    the selected columns).
    """

    _UNREAD = object()

    def __init__(self, blocks: int, read: Callable[[int], BlockExtents | None]) -> None:
        self._read = read
        self._found: list = [self._UNREAD] * blocks

    def __len__(self) -> int:
        return len(self._found)

    def known(self, index: int) -> bool:
        return self._found[index] is not self._UNREAD

    def __getitem__(self, index: int) -> BlockExtents | None:
        found = self._found[index]
        if found is self._UNREAD:
            found = self._found[index] = self._read(index)
        return found
