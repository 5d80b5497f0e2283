"""Reading pieces of blocks from shards into NumPy columns.

Local shards are memory-mapped, so an uncompressed block decodes without a
copy and a compressed one is decompressed by Arrow with the GIL released; many
threads read at once. Every shard is checked against the manifest the first
time it is opened: its size always (a truncated shard is named even without
checksums), its CRC32C when ``verify_checksums``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from reader.plan import Piece
from reader.snapshot import Snapshot, shard_problem
from schemas import columns, shard_codec, storage
from schemas.errors import CorruptSnapshotError

Columns = dict[str, np.ndarray]


class BlockSource:
    """Thread-safe reads of ``Piece``s of one snapshot, projected to ``column_names``."""

    def __init__(self, snapshot: Snapshot, column_names: Sequence[str], *, verify_checksums: bool) -> None:
        self._snapshot = snapshot
        self._columns = list(column_names)
        self._verify = verify_checksums
        self._checked: set[int] = set()
        self._check_lock = threading.Lock()
        self._local = threading.local()

    def _check_once(self, shard: int) -> None:
        with self._check_lock:
            if shard in self._checked:
                return
            info = self._snapshot.metadata.shards[shard]
            path = self._snapshot.shard_path(shard)
            problem = shard_problem(path, info, checksum=self._verify)
            if problem:
                raise CorruptSnapshotError(
                    f"shard {problem}. Run `snapfeed verify {self._snapshot.path}` and materialize again with --mode=write."
                )
            self._checked.add(shard)

    def _reader(self, shard: int) -> pa.ipc.RecordBatchFileReader:
        readers = getattr(self._local, "readers", None)
        if readers is None:
            readers = self._local.readers = {}
        if shard not in readers:
            self._check_once(shard)
            path = self._snapshot.shard_path(shard)
            readers[shard] = shard_codec.open_shard(storage.open_mapped(path), path)
        return readers[shard]

    def read(self, piece: Piece) -> Columns:
        path = self._snapshot.shard_path(piece.shard)
        try:
            block = self._reader(piece.shard).get_batch(piece.block)
        except (pa.ArrowInvalid, OSError) as exc:
            raise CorruptSnapshotError(
                f"block {piece.block} of shard {path} is unreadable ({exc}); run `snapfeed verify` on the snapshot"
            ) from exc
        expected = self._snapshot.metadata.shards[piece.shard].block_rows[piece.block]
        if block.num_rows != expected:
            raise CorruptSnapshotError(
                f"block {piece.block} of shard {path} has {block.num_rows} rows, the manifest says {expected}"
            )
        if piece.start or piece.stop != block.num_rows:
            block = block.slice(piece.start, piece.rows)
        return {name: columns.column_to_numpy(block.column(name)) for name in self._columns}

    def read_window(self, pieces: Sequence[Piece], pool) -> Columns:
        """All pieces read in parallel and concatenated per column, in order."""
        parts = list(pool.map(self.read, pieces)) if len(pieces) > 1 else [self.read(pieces[0])]
        if len(parts) == 1:
            return parts[0]
        return {name: np.concatenate([part[name] for part in parts]) for name in self._columns}
