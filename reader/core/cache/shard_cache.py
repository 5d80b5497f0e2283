"""A host's local disk cache of bucket shards: later epochs read local files, and each byte is downloaded once.

Whole shards are the unit. A cached shard is a plain local file, so a later
epoch reads it exactly as the local-disk reader reads a local snapshot (direct
``preadv`` for plain columns, the page cache, ``reader.core.blocks``), and its
one check is the manifest's whole-file CRC32C. The process that first opens a
shard downloads it whole (4 MiB ranged GETs on a pool of threads) and reads it
meanwhile through ``reader.core.cache.shard_fill``, which fetches first the chunks a
read waits for: the first epoch does not wait for whole shards.

Layout: ``<cache_dir>/<snapshot id>/<run id>/<shard file>.<crc32c>.snapcache``.
The run id puts a snapshot rewritten with ``--mode=write`` under a new
directory (old entries are never hit, and age out), and the CRC32C in the name
ties an entry to the manifest's bytes. Only names ending ``.snapcache*`` are
ever deleted: whatever else lies in the directory is not ours and stays.

Sharing between processes (DataLoader workers, one process per accelerator)
is by ``fcntl.flock``, which the kernel drops with the process however it ends:

- an entry is downloaded under an exclusive lock on its ``.snapcache-lock``
  file, held until the download ends, by the process that asked for it first
  (the download's owner); a second process asking for it meanwhile joins the
  download through its ``.snapcache-chunks`` table (``reader.core.cache.chunk_table``):
  it reads the chunks landed in the download's temporary file and downloads
  the ones its reads need into it, so each shard is downloaded once per host
  and nobody's first batch waits for a whole shard. With
  ``verify_checksums=True`` (the whole shard checked before its first block),
  or where the owner publishes no table, it waits for the finished entry;
- a download goes to a ``.snapcache-tmp`` file locked exclusively while it is
  written, preallocated to the shard's size (a full disk fails before any GET,
  and the budget counts downloads in flight), and is renamed onto the entry
  only once its size and CRC32C match the manifest;
- a reader holds a shared lock on an entry for as long as it has it open;
  eviction takes an exclusive lock without waiting and deletes only what it
  got (never an entry being read, never a download under way), least recently
  opened first, under one ``.snapcache-evict`` lock so that two processes do
  not both count the same free bytes.

An entry is checked (size and CRC32C) when it is downloaded, and records that
in an extended attribute with its file's mtime (``reader.core.cache.entry_check``);
a process opening it checks it again only when that record is missing or no
longer matches (the file was written since), or with ``verify_checksums=True``:
a bad entry is deleted and downloaded again, never read. Where the disk has no
user xattrs every process checks each entry the first time it opens it.

A cache that cannot be used (a read-only or full disk, any local ``OSError``)
gives one warning and the process reads directly from the bucket from then
on: the epoch never fails because of the cache.

Each cache counts how its shards were opened in this process (``counts()``:
from an entry, downloaded, or read from the bucket without it) and the bytes
it downloaded; ``reader.metrics`` serves them as Prometheus counters.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import pathlib
import shutil
import time
import uuid
import warnings

from reader.core import fork_safe
from reader.core.cache import chunk_table, entry_check, shard_fill
from reader.core.cache.chunk_table import ChunkTable
from reader.core.cache.shard_fill import Filling
from schemas import file_lock, shard_codec, storage
from schemas.errors import UsageError

ENV_DIR = "SNAPFEED_CACHE_DIR"
AUTO_DIR = "~/.cache/snapfeed"
#: AUTO budget: this many bytes, or half the free space of the cache's disk when that is less.
AUTO_BUDGET_BYTES = 64 << 30
#: How a shard was opened through the cache: from its entry, downloaded into one, read as another process
#: downloads it (the chunks this one's reads needed first downloaded by this one), or read from the bucket
#: without one (the cache failed, or had no room).
OUTCOMES = ("entry", "download", "joined", "bucket")
ENTRY_SUFFIX = ".snapcache"
LOCK_SUFFIX = ".snapcache-lock"
TEMP_SUFFIX = ".snapcache-tmp"
CHUNKS_SUFFIX = ".snapcache-chunks"
#: How often a process asking for a shard another one has begun downloading looks for its chunk table.
JOIN_POLL_S = 0.005
EVICT_LOCK = ".snapcache-evict"


def resolve_dir(cache_dir: str | os.PathLike | None) -> pathlib.Path | None:
    """``cache_dir=`` as a directory: "auto" is ``$SNAPFEED_CACHE_DIR``, else ``~/.cache/snapfeed``."""
    if cache_dir is None:
        return None
    if not isinstance(cache_dir, str | os.PathLike) or not str(cache_dir):
        raise UsageError(f"cache_dir={cache_dir!r}; give a local directory, 'auto', or None for no cache")
    if str(cache_dir).lower() == "auto":
        cache_dir = os.environ.get(ENV_DIR) or AUTO_DIR
    if "://" in str(cache_dir):
        raise UsageError(f"cache_dir={str(cache_dir)!r} is not on local disk; give a local directory or 'auto'")
    return pathlib.Path(cache_dir).expanduser().absolute()


def auto_budget(directory: pathlib.Path) -> int:
    """``AUTO_BUDGET_BYTES``, or half the free space of the disk the cache is on when that is less."""
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return AUTO_BUDGET_BYTES
    return max(1, min(AUTO_BUDGET_BYTES, free // 2))


def for_options(cache_dir: str | None, cache_bytes: int | None) -> ShardCache | None:
    """The cache that ``cache_dir=``/``cache_bytes=`` (None: AUTO) name, or None without one."""
    directory = resolve_dir(cache_dir)
    if directory is None:
        return None
    if cache_bytes is not None and (
        isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 1
    ):
        raise UsageError(f"cache_bytes={cache_bytes!r}; give a positive number of bytes, or AUTO")
    return open_cache(directory, cache_bytes)


#: Every cache this process opened, in order (``reader.metrics`` counts them).
_opened: list[ShardCache] = []


@functools.cache
def open_cache(directory: pathlib.Path, cache_bytes: int | None) -> ShardCache:
    """One cache object per directory and budget in a process: every reader of it shares its one warning
    and the entries it checked."""
    cache = ShardCache(directory, cache_bytes if cache_bytes is not None else auto_budget(directory))
    _opened.append(cache)
    return cache


def opened_caches() -> list[ShardCache]:
    """The caches this process has opened."""
    return list(_opened)


class _StoreFailed(Exception):
    """The store refused to open a shard: raised as its own error (``__cause__``), as a direct read would."""


class Entry:
    """A verified cache entry, held open with a shared lock (eviction skips it) until ``close`` or collection."""

    def __init__(self, path: pathlib.Path, handle) -> None:
        self.path = str(path)
        self._handle = handle  # closing it (or collecting it) drops the shared lock

    def close(self) -> None:
        self._handle.close()


class ShardCache:
    """Shards of bucket snapshots on local disk under ``budget_bytes``, shared by the processes of a host."""

    def __init__(self, directory: pathlib.Path, budget_bytes: int) -> None:
        self.directory = directory
        self.budget_bytes = budget_bytes
        self._failed = False
        self._lock = fork_safe.Lock()
        self._verified: set[tuple] = set()  # (path, st_dev, st_ino, st_size, st_mtime_ns) checked in this process
        self._counts = dict.fromkeys(OUTCOMES, 0) | {"downloaded_bytes": 0}
        self._swept: set[pathlib.Path] = set()  # run directories whose abandoned downloads were deleted

    def counts(self) -> dict[str, int]:
        """Shards this process opened through the cache, by outcome (``OUTCOMES``), and the bytes it downloaded."""
        with self._lock:
            return dict(self._counts)

    def _counted(self, opened: Entry | Filling | None, size: int) -> Entry | Filling | None:
        if opened is None:
            outcome = "bucket"
        else:
            outcome = "entry" if isinstance(opened, Entry) else "download" if opened.owner else "joined"
        with self._lock:
            self._counts[outcome] += 1
            if outcome == "download":
                self._counts["downloaded_bytes"] += size
        return opened

    def entry_path(self, snapshot, shard: int) -> pathlib.Path:
        info = snapshot.metadata.shards[shard]
        name = f"{pathlib.PurePosixPath(info.path).name}.{info.crc32c:08x}{ENTRY_SUFFIX}"
        return self.directory / snapshot.snapshot_id / snapshot.metadata.run_id / name

    def open(self, snapshot, shard: int, *, recheck: bool = False) -> Entry | Filling | None:
        """The shard's verified entry; a ``Filling`` when this process starts downloading it, or joins the
        download another process has under way (read through it meanwhile); None: read it from the bucket
        (the cache failed and warned once, or has no room). Each shard is downloaded once per host.

        ``recheck``: the entry's CRC32C is computed again in this process whatever its check record says
        (``verify_checksums=True``); a download under way is then waited for, not joined.
        """
        return self._counted(self._open(snapshot, shard, recheck), snapshot.metadata.shards[shard].num_bytes)

    def _open(self, snapshot, shard: int, recheck: bool) -> Entry | Filling | None:
        info = snapshot.metadata.shards[shard]
        if self._failed or info.num_bytes > self.budget_bytes:
            return None
        path = self.entry_path(snapshot, shard)
        lock = None
        try:
            entry = self._hit(path, info, recheck)
            if entry is not None:
                return entry
            path.parent.mkdir(parents=True, exist_ok=True)
            lock = os.open(str(path) + LOCK_SUFFIX, os.O_CREAT | os.O_RDWR, 0o644)
            # A download under way is joined; it is waited for where the whole shard is checked before its first
            # block (verify_checksums=True), and where no OFD locks can share it.
            if recheck or not chunk_table.SHARED:
                fcntl.flock(lock, fcntl.LOCK_EX)
            else:
                joined = self._lock_or_join(lock, snapshot, shard, path)
                if joined is not None:
                    return joined
            entry = self._hit(path, info, recheck)  # another process may have downloaded it while this one waited
            if entry is not None:
                return entry
            temp = self._reserve(path, info.num_bytes)
            if temp is None:
                return None  # no room: everything else is being read
            temp_path, descriptor = temp
            try:
                remote = _open_remote(snapshot, shard)  # the store's error now, as a direct read would raise it
                chunks = shard_fill.chunk_count(info.num_bytes, shard_fill.CHUNK_BYTES)
                table = ChunkTable.create(
                    str(path) + CHUNKS_SUFFIX, os.path.basename(temp_path), shard_fill.CHUNK_BYTES, chunks
                )
            except BaseException:
                os.close(descriptor)
                os.unlink(temp_path)
                raise
            filling = Filling(
                lambda: remote,
                info.num_bytes,
                info.crc32c,
                temp_path,
                str(path),
                descriptor,
                table,
                lock,
                self._give_up,
                self._publish,
            )
            lock = None  # the download's now: let go when it ends
            return filling
        except _StoreFailed as failed:
            raise failed.__cause__ from None
        except OSError as exc:  # the cache's disk: every OSError but the store's
            self._give_up(exc)
        finally:
            if lock is not None:
                os.close(lock)
        return None

    def _lock_or_join(self, lock: int, snapshot, shard: int, path: pathlib.Path) -> Filling | None:
        """Takes the download lock (this process downloads the shard, or finds it downloaded), or joins the
        download of the process that holds it; that one publishes its chunk table a few milliseconds after
        taking the lock (once its temporary file is made), so this looks again until either happens."""
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one owner per download; held until it ends
                return None
            except BlockingIOError:  # another process is downloading it
                joined = self._join(snapshot, shard, path)
                if joined is not None:
                    return joined
            time.sleep(JOIN_POLL_S)

    def _join(self, snapshot, shard: int, path: pathlib.Path) -> Filling | None:
        """The download of ``path`` another process has under way, joined through its chunk table; None when
        it publishes none, or its table is a download that has ended (nobody holds the file it names)."""
        info = snapshot.metadata.shards[shard]
        table = ChunkTable.join(str(path) + CHUNKS_SUFFIX)
        if table is None:
            return None
        descriptor, temp = None, path.parent / table.temp_name
        if table.chunks == shard_fill.chunk_count(info.num_bytes, table.chunk_bytes):  # else another shard's
            descriptor = _held_download(temp)
        if descriptor is None:
            table.close()
            return None
        # The bucket's shard is opened when this process first downloads a chunk of it (a request on GCS).
        return Filling(
            functools.partial(storage.open_random_access, snapshot.shard_path(shard)),
            info.num_bytes,
            info.crc32c,
            str(temp),
            str(path),
            descriptor,
            table,
            None,
            self._give_up,
            self._publish,
        )

    def _give_up(self, exc: BaseException) -> None:
        with self._lock:
            if self._failed:
                return
            self._failed = True
        warnings.warn(
            f"snapfeed cache {self.directory} cannot be used ({type(exc).__name__}: {exc}); this process reads "
            f"from the bucket directly from now on. Free space there, or pass another cache_dir=",
            stacklevel=2,
        )

    def _hit(self, path: pathlib.Path, info, recheck: bool) -> Entry | None:
        """The entry opened with a shared lock when it is there and matches the manifest; a bad one is deleted.

        It matches when this process checked it, or its check record says it is unchanged since a check
        (unless ``recheck``), or its CRC32C is the manifest's now (then recorded)."""
        try:
            handle = open(path, "rb", buffering=0)  # noqa: SIM115 - held open: the lock lives as long as it
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH)
            stat = os.fstat(handle.fileno())
            try:
                if os.stat(path).st_ino != stat.st_ino:
                    raise FileNotFoundError(path)  # evicted (or replaced) between open and lock
            except FileNotFoundError:
                handle.close()
                return None
            key = (str(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
            trusted = key in self._verified or (
                not recheck
                and entry_check.recorded(handle.fileno()) == entry_check.record_of(info.crc32c, info.num_bytes, stat)
            )
            if not trusted:
                crc, size = shard_codec.checksum_file(handle) if stat.st_size == info.num_bytes else (None, None)
                if size != info.num_bytes or crc != info.crc32c:
                    handle.close()
                    path.unlink(missing_ok=True)  # never delivered: downloaded again by the caller
                    return None
                entry_check.record(handle.fileno(), info.crc32c, info.num_bytes, stat)
            self._verified.add(key)
            with contextlib.suppress(OSError):  # a cache on a read-only disk is still read
                os.utime(path, ns=(time.time_ns(), stat.st_mtime_ns))  # recency for eviction: atime, mtime as it was
        except BaseException:
            handle.close()
            raise
        return Entry(path, handle)

    def _reserve(self, path: pathlib.Path, size: int) -> tuple[str, int] | None:
        """A temporary file for a download, made room for, locked exclusively and allocated whole (a full disk
        fails here, before any GET); None when the budget has no room (every other entry is being read)."""
        temp = str(path.with_name(f"{path.name}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}"))
        with file_lock.locked(self.directory / EVICT_LOCK):  # room counted and taken at once
            self._sweep_abandoned(path.parent)
            if not self._make_room(size):
                return None
            descriptor = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
            fcntl.flock(descriptor, fcntl.LOCK_EX)  # a download under way is never evicted
            try:
                os.ftruncate(descriptor, size)  # its size counted by the next _make_room, even before it is allocated
            except OSError:
                os.close(descriptor)
                os.unlink(temp)
                raise
        try:
            if size:
                os.posix_fallocate(descriptor, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a filesystem without it: pwrite tells
                os.close(descriptor)
                os.unlink(temp)
                raise
        return temp, descriptor

    def _sweep_abandoned(self, directory: pathlib.Path) -> None:
        """Deletes the downloads of ``directory`` that nobody holds (their process ended mid-download: an
        interrupted job leaves whole preallocated shards there), and their chunk tables, once per directory in
        this process; under the eviction lock, where a download is made and locked in one step."""
        if directory in self._swept:
            return
        self._swept.add(directory)
        for found in directory.glob(f"*{TEMP_SUFFIX}"):
            _delete_unheld(found)
        for table in directory.glob(f"*{CHUNKS_SUFFIX}*"):  # a chunk table, or one being written
            _delete_ownerless_table(table)

    def _publish(self, temp: str, entry: str) -> None:
        """Renames a finished download onto its entry under the eviction lock: ``_make_room`` lists the
        files, then stats them, and a rename in between hid a download under both names (two processes
        then each found room for one more shard than the budget holds)."""
        with file_lock.locked(self.directory / EVICT_LOCK):
            os.rename(temp, entry)

    def _make_room(self, wanted: int) -> bool:
        """Deletes least recently opened entries (and abandoned downloads) nobody holds, until ``wanted`` more
        bytes fit the budget; False when they cannot."""
        files = []
        for found in self.directory.rglob(f"*{ENTRY_SUFFIX}*"):
            if found.name.endswith((ENTRY_SUFFIX, TEMP_SUFFIX)):
                with contextlib.suppress(FileNotFoundError):
                    stat = found.stat()
                    files.append((stat.st_atime, stat.st_size, found))
        used = sum(size for _, size, _ in files)
        for _, size, found in sorted(files):
            if used + wanted <= self.budget_bytes:
                break
            if _delete_unheld(found):
                used -= size
        return used + wanted <= self.budget_bytes


def _lock_now(path: pathlib.Path, flags: int, operation: int) -> tuple[int | None, bool]:
    """``path`` opened with ``flags`` and ``flock``ed with ``operation`` if nobody holds a conflicting lock:
    (its descriptor, whether this took the lock); (None, False) when there is no such file."""
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        return None, False
    try:
        fcntl.flock(descriptor, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return descriptor, False
    return descriptor, True


def _held_download(temp: pathlib.Path) -> int | None:
    """``temp`` opened for reading and writing while its downloader holds it (the download is under way);
    None when it is gone or nobody holds it (its download ended, or it just became an entry)."""
    descriptor, unheld = _lock_now(temp, os.O_RDWR, fcntl.LOCK_SH)
    if descriptor is not None and unheld:
        os.close(descriptor)
        return None
    return descriptor


def _delete_ownerless_table(table: pathlib.Path) -> None:
    """Deletes a chunk table whose entry's download lock nobody holds: its owner ended without deleting it
    (an owner makes, and deletes, its table only holding that lock)."""
    lock = table.with_name(table.name.split(CHUNKS_SUFFIX)[0] + LOCK_SUFFIX)
    descriptor, unheld = _lock_now(lock, os.O_RDWR, fcntl.LOCK_EX)
    try:
        if descriptor is None or unheld:
            table.unlink(missing_ok=True)
    finally:
        if descriptor is not None:
            os.close(descriptor)


def _open_remote(snapshot, shard: int):
    """The bucket's shard, opened for ranged GETs; the store's error raised as its own (``_StoreFailed``)."""
    try:
        return storage.open_random_access(snapshot.shard_path(shard))
    except BaseException as exc:
        raise _StoreFailed() from exc


def _delete_unheld(path: pathlib.Path) -> bool:
    """Deletes ``path`` when no process holds a lock on it (nobody reads or writes it); whether it did."""
    descriptor, unheld = _lock_now(path, os.O_RDONLY, fcntl.LOCK_EX)
    if descriptor is None:
        return True
    try:
        if unheld:
            path.unlink(missing_ok=True)
        return unheld
    finally:
        os.close(descriptor)
