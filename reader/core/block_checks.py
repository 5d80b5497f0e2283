"""Each block's CRC32C checked the first time this process reads it (``verify_checksums="blocks"``).

The manifest records a CRC32C per block (format 1.1: ``ShardInfo.block_crc32c``,
over the block's IPC message, the byte range the shard's footer lists), so
damage inside a shard's data is found by the read that meets it, without the
whole-shard check (``verify_checksums=True``), which reads every shard once
more before its first block. A block is checked once per process: later
epochs, other iterators and pipelines of the same process read it from the page
cache and pay only a set lookup. Snapshots of format 1.0 record no block CRCs:
their blocks are checked only by ``verify_checksums=True``.

Not the default, by measurement (``bench.reader_bench``'s snapfeed worker with
``BENCH_VERIFY_CHECKSUMS=blocks`` or not, 200 MB per row size, a 2-core VM, the
median of 3 interleaved pairs): the first epoch read 11% (100 B rows) to 17%
(3 KB and 150 KB rows) fewer rows a second, later epochs as many. A direct block
is read whole once for the check (about 0.2 CPU s/GB with its CRC32C) where
without it only its header and the selected rows are read.
"""

from __future__ import annotations

import google_crc32c
import pyarrow as pa

from reader.core.snapshot import Snapshot
from schemas.errors import CorruptSnapshotError

#: (shard path, block, CRC32C) of every block this process has found intact. Adding to a set is atomic
#: under the GIL, and two threads checking one block at once only check it twice.
_CHECKED: set[tuple[str, int, int]] = set()


class BlockChecks:
    """The block CRC32Cs of one snapshot's shards, and whether this process has checked each block yet."""

    def __init__(self, snapshot: Snapshot, *, enabled: bool) -> None:
        self._snapshot = snapshot
        self._enabled = enabled

    def shard_checked(self, shard: int) -> None:
        """Notes every block of a shard whose whole CRC32C was just found right: not checked again."""
        if self._enabled:
            for block in range(len(self._snapshot.shard_info(shard).block_crc32c)):
                _CHECKED.add(self._key(shard, block))

    def _key(self, shard: int, block: int) -> tuple[str, int, int] | None:
        """The block's key in the set of checked blocks; None when nothing is to be checked."""
        if not self._enabled:
            return None
        crcs = self._snapshot.shard_info(shard).block_crc32c
        if block >= len(crcs):
            return None  # format 1.0: no block CRCs recorded
        return self._snapshot.shard_path(shard), block, crcs[block]

    def needed(self, shard: int, block: int) -> bool:
        """Whether the block is still to be checked in this process."""
        key = self._key(shard, block)
        return key is not None and key not in _CHECKED

    def check(self, shard: int, block: int, message: pa.Buffer) -> None:
        """Checks a block's message bytes (header and body) against the manifest, unless already done.

        Raises ``CorruptSnapshotError`` naming the shard and block and saying what to do.
        """
        key = self._key(shard, block)
        if key is None or key in _CHECKED:
            return
        path, _, expected = key
        found = google_crc32c.value(message)
        if found != expected:
            member, _ = self._snapshot.locate(shard)
            raise CorruptSnapshotError(
                f"block {block} of shard {path}: CRC32C {found:08x} differs from the manifest's {expected:08x} "
                f"(corrupt bytes); run `snapfeed verify {member.path}` and materialize the snapshot again "
                f"with --mode=write"
            )
        _CHECKED.add(key)
