"""An uncompressed shard read straight into NumPy memory: where each column's bytes lie, and positioned reads.

In a block of an uncompressed shard every fixed-width column (numbers and
fixed-shape tensors without nulls) is one contiguous run of bytes in the file,
so a row of a column is ``row_bytes`` bytes at a known file offset, and no
Arrow decode is needed to get at it. Where each run starts is read from the
block's IPC header (``reader.core.ipc_layout``, by ``reader.core.blocks``);
this module holds those extents and reads rows at them with ``preadv``.

A shard truncated under a running reader is a ``CorruptSnapshotError`` naming
it (a read comes back short), never a crash.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

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


class DirectShard:
    """One uncompressed shard, open for positioned reads, with where each column of each block lies.

    ``blocks[i]`` is block ``i``'s extents, or None when that block is not
    plain runs of bytes (it is decoded by Arrow instead).
    """

    def __init__(self, path: str, blocks: Sequence[BlockExtents | None]) -> None:
        self.path = path
        self.blocks = blocks
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 - lives as long as the shard is read

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
        """Fills ``destination`` with the shard's bytes from ``offset`` (one positioned read, GIL released)."""
        while destination:
            done = os.preadv(self._file.fileno(), [destination], offset)
            if done == 0:
                raise CorruptSnapshotError(
                    f"shard {self.path} ends at byte {offset}, short of a row the manifest lists; "
                    f"run `snapfeed verify` on the snapshot"
                )
            destination, offset = destination[done:], offset + done
