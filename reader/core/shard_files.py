"""A snapshot's shard files for the block reader (``reader.core.blocks``): each opened once, checked first.

Every shard is checked against the manifest the first time it is opened: its
size always (a truncated shard is named even without checksums), its CRC32C
when ``verify_checksums=True``; its footer is read once then. A bucket shard is
read from its local copy in the host's cache when one is given
(``reader.core.cache``). The errors that name a damaged shard, cut short or
unreadable, are made here for every read path.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from collections.abc import Sequence

import pyarrow as pa

from reader.core import block_checks, block_io, fork_safe
from reader.core.block_io import ShortReadError
from reader.core.cache import Entry, Filling, ShardCache
from reader.core.ipc_layout import ShardLayout
from reader.core.snapshot import Snapshot, shard_problem
from schemas import paths, storage
from schemas.errors import CorruptSnapshotError


@dataclasses.dataclass(frozen=True)
class OpenShard:
    file: object  # a pyarrow random-access file: read_at is a pread or one ranged GET
    layout: ShardLayout
    local: str | None  # the local file read (the shard, or its cache entry); None: a bucket's


#: Local shards opened at once: their opens wait on no round trip, only on the CPU (a CRC32C pass with
#: ``verify_checksums=True``).
_LOCAL_OPENERS = os.cpu_count() or 1


class ShardFiles:
    """The shards of one snapshot, opened once for all threads; thread-safe."""

    def __init__(
        self,
        snapshot: Snapshot,
        *,
        verify_checksums: bool | str,
        checks: block_checks.BlockChecks,
        cache: ShardCache | None,
    ) -> None:
        """``checks`` is told which shards were checked whole (their blocks need no check of their own)."""
        self._snapshot = snapshot
        # Bucket shards are read from the cache's local copies (reader.core.cache.shard_cache); local ones never are.
        self._cache = cache
        self._entries: list[Entry | Filling] = []  # held (shared-locked) as long as this lives
        self._verify = verify_checksums
        self._checks = checks
        self._shards: dict[int, OpenShard] = {}
        self._local: dict[int, bool] = {}
        self._locks: dict[int, fork_safe.Lock] = {}  # a forked reader opens what its parent was opening
        self._locks_lock = fork_safe.Lock()

    @property
    def cached(self) -> bool:
        """Whether bucket shards are read from the host's cache (whether one is, is known once it is open)."""
        return self._cache is not None

    def _cache_of(self, shard: int) -> ShardCache | None:
        """The cache a shard is read through: a bucket's shards only."""
        return self._cache if self._cache is not None and not self._on_local_disk(shard) else None

    def _on_local_disk(self, shard: int) -> bool:
        return storage.local_path(self._snapshot.shard_path(shard)) is not None

    def lock(self, shard: int) -> fork_safe.Lock:
        """The lock the shard is opened under."""
        with self._locks_lock:
            if shard not in self._locks:
                self._locks[shard] = fork_safe.Lock()
            return self._locks[shard]

    def open(self, shard: int) -> OpenShard:
        """The shard checked against the manifest, opened and its footer read, once for all threads.

        Blocks are read with positioned reads (thread-safe), not memory maps:
        mapped pages would count in the trainer's RSS for the whole snapshot.
        Shards are opened under a lock of their own, so opening many (object
        stores: a few round trips each) overlaps.
        """
        opened = self._shards.get(shard)
        if opened is not None:
            return opened
        with self.lock(shard):
            if shard in self._shards:
                return self._shards[shard]
            info = self._snapshot.shard_info(shard)
            path = self._snapshot.shard_path(shard)
            recheck = self._verify is True  # verify_checksums=True: every shard's CRC32C in this process
            cache = self._cache_of(shard)
            entry = cache.open(*self._snapshot.locate(shard), recheck=recheck) if cache is not None else None
            if entry is not None:
                self._entries.append(entry)
                if entry.path is None and self._verify is True:
                    entry.wait_checked()  # a download: the whole shard's CRC32C before its first block, as asked
                if entry.path is not None or self._verify is True:  # an entry was checked against the manifest
                    self._checks.shard_checked(shard)
            if cache is not None and entry is None:  # read from the bucket, not from a local file
                self._local[shard] = False
            if self._verify is True and entry is None:
                self._check(path, info, checksum=True)
                self._checks.shard_checked(shard)
            try:
                if entry is not None and entry.path is None:
                    file = entry  # a download under way, read as it lands
                else:
                    file = storage.open_random_access(entry.path if entry else path)
                size = file.size()  # what opening learnt: no request of its own on an object store
            except OSError:
                self._check(path, info, checksum=False)  # names a missing shard
                raise
            if size != info.num_bytes:
                self._check(path, info, checksum=False)  # names a truncated or overwritten one
            try:
                layout = block_io.read_layout(file, info.num_bytes)
            except (ValueError, pa.ArrowException, OSError) as exc:
                raise self.unreadable(f"shard {path}", path, exc) from exc
            if layout.dictionaries or len(layout.blocks) != len(info.block_rows):
                raise self.unreadable(
                    f"shard {path}",
                    path,
                    ValueError(
                        f"its footer lists {len(layout.blocks)} blocks and {layout.dictionaries} dictionaries, "
                        f"the manifest {len(info.block_rows)} blocks and no dictionary"
                    ),
                )
            self._shards[shard] = OpenShard(file, layout, entry.path if entry else storage.local_path(path))
            return self._shards[shard]

    def _check(self, path: str, info, *, checksum: bool) -> None:
        if problem := shard_problem(path, info, checksum=checksum):
            raise CorruptSnapshotError(
                f"shard {problem}. Run `snapfeed verify {self._folder(path)}` and materialize again with --mode=write."
            )

    def _folder(self, shard_path: str) -> str:
        """The snapshot folder holding a shard (a union's member), for what to verify."""
        return paths.dirname(paths.dirname(shard_path))

    def file(self, shard: int):
        return self.open(shard).file

    def is_open(self, shard: int) -> bool:
        """Whether ``open`` has opened the shard (so opening it again waits for nothing)."""
        return shard in self._shards

    def open_many(self, shards: Sequence[int], threads: int) -> None:
        """Opens the shards not open yet: a bucket's ``threads`` at a time (their round trips overlap), local files
        a core's worth at a time (a footer read, and a CRC32C pass with ``verify_checksums=True``: CPU work).

        A window of a union or mixture of 64 snapshots opens 64 local shards at once: on 32 threads that was
        32 threads more at the first window's peak, for opens of microseconds each.
        """
        missing = [shard for shard in dict.fromkeys(shards) if shard not in self._shards]
        local = set(self._local_ones(missing))
        self._open_all([shard for shard in missing if shard in local], _LOCAL_OPENERS)
        self._open_all([shard for shard in missing if shard not in local], threads)

    def open_local(self, shards: Sequence[int]) -> None:
        """Opens the local files among ``shards`` not open yet, here and now (a window's, before its reads:
        each opened on the I/O pool would be a task, and a thread, of its own): one after another, or a core's
        worth at a time when each is a CRC32C pass (``verify_checksums=True``)."""
        missing = self._local_ones([shard for shard in dict.fromkeys(shards) if shard not in self._shards])
        self._open_all(missing, _LOCAL_OPENERS if self._verify is True else 1)

    def _local_ones(self, shards: list[int]) -> list[int]:
        return [shard for shard in shards if self._on_local_disk(shard)]

    def _open_all(self, shards: list[int], threads: int) -> None:
        if len(shards) <= 1 or threads <= 1:
            for shard in shards:
                self.open(shard)
            return
        with concurrent.futures.ThreadPoolExecutor(min(threads, len(shards)), "snapfeed-open") as openers:
            list(openers.map(self.open, shards))

    def is_local(self, shard: int) -> bool:
        """Whether the shard is read from a local file: a bucket's is, from the cache (until it cannot take it)."""
        if shard not in self._local:
            self._local[shard] = self._on_local_disk(shard) or self._cache is not None
        return self._local[shard]

    def cut_short(self, path: str, exc: ShortReadError) -> CorruptSnapshotError:
        return CorruptSnapshotError(
            f"shard {path} ends at byte {exc.end}, short of a block its footer lists; "
            f"run `snapfeed verify {self._folder(path)}` and materialize the snapshot again with --mode=write"
        )

    def unreadable(self, what: str, shard_path: str, exc: Exception) -> CorruptSnapshotError:
        """The one error for damaged bytes, whether the direct path or Arrow's decoder (any codec) met them:
        ``what`` (a shard, a block of one) of the shard at ``shard_path`` is unreadable."""
        detail = " ".join(str(exc).split())  # Arrow pads some messages with hundreds of spaces
        return CorruptSnapshotError(
            f"{what} is unreadable ({detail}): it is corrupt; run `snapfeed verify {self._folder(shard_path)}` "
            f"and materialize the snapshot again with --mode=write"
        )
