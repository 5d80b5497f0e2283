"""A shard being downloaded into the cache, readable while it downloads: the first epoch does not wait for it.

Downloading a shard whole before reading it would make the first batch wait
for every shard the first window touches (on ``bench/remote_read_bench.py``,
the whole snapshot). Instead the shard's 4 MiB chunks are fetched by the
process's download threads (``reader.core.cache.download_queue``), in file order, and a read of some
bytes (a footer, a window's blocks) moves the chunks holding them to the
front of the queue and waits for those only. Each byte is still downloaded
once: reads are served from the chunks written to the cache's temporary file,
straight into the reader's memory where the shard is read directly (no buffer
of the reader's holds a downloading block), and ``will_need`` moves the chunks
of the windows read ahead before the rest of the download. The footer, which
opening the shard reads at once, is queued first.

Other processes of the host that open the shard meanwhile join the download
instead of waiting for all of it: the downloader publishes which chunks have
landed (``reader.core.cache.chunk_table``), and a joining process reads the landed
chunks from the same temporary file and downloads the chunks its own reads
need into it, each chunk by whichever process claims it first (a claim dies
with its process: a chunk whose downloader ended is downloaded by the next
process that needs it). The downloader, which queued every chunk, takes up
the ones others landed without a GET, so each byte is still downloaded once
per host, and it alone finishes the file.

Each chunk's CRC32C is taken from memory as it lands; when the last one has
landed they are combined in file order (``shard_codec.crc32c_concat``: the
file is not read again) and checked with its size against the manifest, and
the file is renamed onto its entry (``reader.core.cache.shard_cache``); its lock
becomes a shared one, so the entry is held like any other while this reader
lives. A chunk that the cache's disk refused is read from the bucket instead
(the cache warns once); a failed GET is raised to the read that needed it, as
a direct read would raise it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import warnings
import weakref

import google_crc32c
import pyarrow as pa

from reader.core import block_io, fork_safe, reaper
from reader.core.cache import download_queue, entry_check
from reader.core.cache.chunk_table import ChunkTable
from reader.core.cache.download_queue import AHEAD, BACKGROUND, DEMANDED
from schemas import shard_codec
from schemas.errors import CorruptSnapshotError

#: One ranged GET of a download: big enough that the round trip is small beside the transfer, small
#: enough that a read waits for little more than it needs.
CHUNK_BYTES = 4 << 20
_FILLINGS: weakref.WeakSet[Filling] = weakref.WeakSet()  # this process's downloads, under way or done


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker started while the trainer downloads) has none of its parent's
    download threads (``download_queue`` makes it a queue of its own): it leaves its parent's downloads to it."""
    for filling in list(_FILLINGS):
        filling._left_to_parent()


os.register_at_fork(after_in_child=_after_fork_in_child)


_THREAD = threading.local()


def _chunk_buffer(size: int) -> pa.Buffer:
    """The calling download thread's one chunk buffer, reused: downloads allocate nothing per chunk (fresh
    buffers freed at GB/s stayed in the allocator: peak RSS grew by hundreds of MB); a new one when a
    download's chunks are larger than it (tests change ``CHUNK_BYTES``; a joined download has its owner's)."""
    if getattr(_THREAD, "buffer", None) is None or _THREAD.buffer.size < size:
        _THREAD.buffer = pa.py_buffer(bytearray(size))
    return _THREAD.buffer


def chunk_count(size: int, chunk_bytes: int) -> int:
    return -(-size // chunk_bytes)


class _PreadStream:
    """What ``block_io.read_exactly`` reads from: positioned reads of the temporary file (GIL released)."""

    def __init__(self, descriptor: int, offset: int, length: int) -> None:
        self._descriptor, self._position, self._end = descriptor, offset, offset + length

    def readinto(self, view: memoryview) -> int:
        wanted = min(len(view), self._end - self._position)
        got = os.preadv(self._descriptor, [view[:wanted]], self._position) if wanted > 0 else 0
        self._position += got
        return got


def _write_all(descriptor: int, data: memoryview, offset: int) -> None:
    """Writes all of ``data`` at ``offset``: a disk that fills up part way writes less, and the next
    write says why (ENOSPC, EFBIG), where a short write left unchecked would leave a hole in the entry."""
    while data:
        written = os.pwrite(descriptor, data, offset)
        data, offset = data[written:], offset + written


class Filling:
    """A shard downloading into ``temp``, read through ``get_stream``/``size`` (fetched and decoded) or
    ``pread``/``pread_now``/``will_need`` (direct reads, ``reader.core.direct_shard``).

    Made by the download's owner (``lock``: the entry's download lock, held; ``temp`` held with an
    exclusive lock), which downloads every chunk and finishes the file, or by a process joining another's
    download (``lock`` None), which downloads only what its reads need. ``path`` is None: the shard is read
    through this object, never as a local file, by its reader.
    """

    path = None

    def __init__(
        self,
        open_remote,
        size: int,
        crc32c: int,
        temp: str,
        entry: str,
        descriptor: int,
        table: ChunkTable,
        lock: int | None,
        on_disk_error,
        publish,
    ):
        """``open_remote()``: the bucket's shard, opened for ranged GETs; ``table``: the download's chunk table
        (the owner made it); ``publish(temp, entry)`` renames the finished download onto its entry (under the
        cache's eviction lock: eviction never sees the file under neither name); ``on_disk_error(exc)`` is told
        of a disk the cache cannot use."""
        self._open_remote = open_remote
        self._remote_file = None  # the bucket's file: chunks are read from it, and reads when the disk fails
        self._remote_opened = fork_safe.Lock()
        self._size, self._crc32c = size, crc32c
        self._temp, self._entry = temp, entry
        self._descriptor, self._lock_descriptor = descriptor, lock
        self._table, self.owner = table, lock is not None
        self._chunk_bytes = table.chunk_bytes
        self._on_disk_error = on_disk_error
        self._publish = publish
        chunks = table.chunks
        self._landed = [threading.Event() for _ in range(chunks)]
        self._claimed = [False] * chunks
        self._left = chunks
        self._mutex = fork_safe.Lock()
        self._failure: BaseException | None = None
        self._disk_failed = False
        self._finished = threading.Event()
        self._problem = ""  # why the finished download was not kept (its bytes do not match the manifest)
        self._chunk_crcs = [0] * chunks  # each chunk's CRC32C, from memory as it lands (_finish combines them)
        self._in_parent = False  # a forked child's copy of its parent's download under way (_left_to_parent)
        self._holds_file = self.owner  # whether this holds a lock on the file (eviction spares it): _hold_once_done
        _FILLINGS.add(self)
        # When no reader and no queued chunk needs them; closed on the reaper thread, as I/O may not run in the GC.
        reaper.on_collect(self, _close_both, descriptor, table)
        if not self.owner:
            return  # a joined download: its owner downloads the rest
        if chunks:  # the footer, which opening the shard reads at once, before the rest
            download_queue.get().push(DEMANDED, self, chunks - 1)
        for chunk in range(chunks):
            download_queue.get().push(BACKGROUND, self, chunk)
        if not chunks:
            self._finish()

    def size(self) -> int:
        return self._size

    def _remote(self):
        """The bucket's shard, opened the first time this process reads from it: a process that joins a
        download often takes up every chunk it needs from others, and opening costs a request."""
        with self._remote_opened:
            if self._remote_file is None:
                self._remote_file = self._open_remote()
            return self._remote_file

    def _chunks(self, offset: int, length: int) -> range:
        return range(
            offset // self._chunk_bytes, min(len(self._landed), chunk_count(offset + length, self._chunk_bytes))
        )

    def get_stream(self, offset: int, length: int):
        """The bytes ``[offset, offset + length)``, once the chunks holding them have landed."""
        chunks = self._chunks(offset, length)
        if self._in_parent:  # chunks still to land would land in the parent only
            if self._landed_in_file(offset, length):
                return _PreadStream(self._descriptor, offset, length)
            return self._remote().get_stream(offset, length)
        self._hold_once_done()
        for chunk in chunks:
            if not self._landed[chunk].is_set() and not self._taken_up(chunk):
                download_queue.get().push(DEMANDED, self, chunk)
        for chunk in chunks:
            self._landed[chunk].wait()
        if self._failure is not None:
            if self._disk_failed:
                return self._remote().get_stream(offset, length)
            raise self._failure
        return _PreadStream(self._descriptor, offset, length)

    # Direct reads (``reader.core.direct_shard.ShardFile``): straight into the reader's memory, no fetch buffer.

    def pread(self, destination: memoryview, offset: int) -> int:
        """Reads up to ``len(destination)`` bytes at ``offset`` once they have landed (0 past the end)."""
        length = min(len(destination), self._size - offset)
        return self.get_stream(offset, length).readinto(destination[:length]) if length > 0 else 0

    def pread_now(self, destination: memoryview, offset: int) -> int:
        """Reads the bytes at ``offset`` when every chunk holding them has landed; 0 when a read would wait."""
        length = min(len(destination), self._size - offset)
        if not self._in_parent:
            self._hold_once_done()
        if length <= 0 or not self._landed_in_file(offset, length):
            return 0
        return os.preadv(self._descriptor, [destination[:length]], offset)

    def _hold_once_done(self) -> None:
        """A joined download's file is held shared, as an entry's readers hold it, once its owner has let go
        of it exclusively (it became the entry, or the download failed): eviction then spares it while this
        reads on, also after the owner's process has ended. Tried without waiting at each read until then."""
        if self._holds_file:
            return
        try:
            fcntl.flock(self._descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # still downloading
        self._holds_file = True

    def will_need(self, offset: int, length: int) -> None:
        """Moves the chunks holding these bytes ahead of the rest of the download: a read needs them soon."""
        if self._in_parent:
            return  # the parent's threads download it
        for chunk in self._chunks(offset, length):
            if not self._landed[chunk].is_set():
                download_queue.get().push(AHEAD, self, chunk)

    def _landed_in_file(self, offset: int, length: int) -> bool:
        """Whether the bytes are in the temporary file (a failure marks every chunk landed, none of them there).
        Chunks another process landed are taken up, but not by a forked child's copy, which counts nothing."""
        if self._in_parent:
            taken = lambda chunk: self._table.landed(chunk) is not None  # noqa: E731
        else:
            taken = self._taken_up
        return self._failure is None and all(
            self._landed[chunk].is_set() or taken(chunk) for chunk in self._chunks(offset, length)
        )

    def _taken_up(self, chunk: int) -> bool:
        """Whether another process had landed the chunk: then it counts as landed here too, with no GET."""
        crc = self._table.landed(chunk)
        if crc is None or not self.claim(chunk):
            return False
        self._landed_chunk(chunk, crc)
        return True

    def _left_to_parent(self) -> None:
        """In a forked child: the download, if still under way, goes on in the parent, on threads the fork
        did not copy. The child reads what had not landed by the fork from the bucket, and closes its copy
        of the download's lock: a lock is held while any copy is open, and other processes wait on it for
        the entry until the parent's download ends."""
        if self._finished.is_set():
            return
        self._in_parent = True
        self._finished.set()  # nothing ends it here: no chunk is downloaded, no file renamed or deleted
        if self.owner:
            os.close(self._lock_descriptor)

    def wait_checked(self) -> None:
        """Waits for the whole shard; raises ``CorruptSnapshotError`` when it does not match the manifest. The
        owner's only: a joined download ends in another process (``verify_checksums=True`` never joins one)."""
        self._finished.wait()
        if self._failure is not None and not self._disk_failed:
            raise self._failure
        if self._problem:
            raise CorruptSnapshotError(self._problem)

    def claim(self, chunk: int) -> bool:
        with self._mutex:
            if self._claimed[chunk] or self._failure is not None:
                return False
            self._claimed[chunk] = True
            return True

    def land(self, chunk: int) -> None:
        """Lands one chunk in the temporary file (on a download thread, the chunk claimed in this process):
        taken up when another process landed it, waited for while another downloads it, else downloaded
        here. The owner's last chunk finishes the file."""
        crc = self._table.landed(chunk)
        if crc is None:
            try:
                self._table.claim(chunk, wait=True)
            except OSError as exc:
                return self.fail(exc, disk=True)
            try:
                crc = self._table.landed(chunk)  # landed while this waited for its claim
                if crc is None:
                    crc = self._download(chunk)
                    if crc is None:
                        return None  # failed, and said so
                    self._table.mark_landed(chunk, crc)
            except OSError as exc:
                return self.fail(exc, disk=True)
            finally:
                self._table.release(chunk)
        self._landed_chunk(chunk, crc)
        return None

    def _download(self, chunk: int) -> int | None:
        """GETs one chunk into the temporary file; its CRC32C, or None when it failed (``fail`` told)."""
        offset = chunk * self._chunk_bytes
        length = min(self._chunk_bytes, self._size - offset)
        try:
            data = block_io.read_exactly(self._remote(), offset, length, _chunk_buffer(self._chunk_bytes))
        except Exception as exc:  # noqa: BLE001 - the store's error, raised to the reads that wait for it
            self.fail(exc, disk=False)
            return None
        try:
            _write_all(self._descriptor, memoryview(data)[:length], offset)
        except OSError as exc:
            self.fail(exc, disk=True)
            return None
        return google_crc32c.value(data.slice(0, length))

    def _landed_chunk(self, chunk: int, crc: int) -> None:
        self._chunk_crcs[chunk] = crc
        self._landed[chunk].set()
        with self._mutex:
            self._left -= 1
            last = self._left == 0
        if last and self.owner:
            self._finish()

    def fail(self, exc: BaseException, *, disk: bool) -> None:
        with self._mutex:
            if self._failure is not None:
                return
            self._failure, self._disk_failed = exc, disk
        for landed in self._landed:
            landed.set()
        if disk:
            self._on_disk_error(exc)
        self._let_go(keep=False)

    def _finish(self) -> None:
        """Checks the whole file against the manifest, then renames it onto its entry and holds it shared."""
        if self._failure is not None:
            return  # a chunk landed after another failed: the download has been let go
        crc, chunk_bytes = 0, self._chunk_bytes
        for chunk, chunk_crc in enumerate(self._chunk_crcs):  # in file order, whatever order they landed in
            crc = shard_codec.crc32c_concat(crc, chunk_crc, min(chunk_bytes, self._size - chunk * chunk_bytes))
        size = os.fstat(self._descriptor).st_size
        if size != self._size or crc != self._crc32c:
            self._problem = (
                f"{self._entry}: {size} bytes with CRC32C {crc:08x} downloaded, the manifest says {self._size} "
                f"bytes, {self._crc32c:08x}; the shard in the bucket is corrupt: run `snapfeed verify` on the "
                f"snapshot and materialize it again with --mode=write"
            )
            warnings.warn(f"not cached: {self._problem}", stacklevel=2)
            return self._let_go(keep=False)
        entry_check.record(self._descriptor, self._crc32c, self._size, os.fstat(self._descriptor))
        try:
            self._publish(self._temp, self._entry)
            fcntl.flock(self._descriptor, fcntl.LOCK_SH)  # an entry now: held while this reader lives
        except OSError as exc:
            self._on_disk_error(exc)
            return self._let_go(keep=False)
        return self._let_go(keep=True)

    def _let_go(self, *, keep: bool) -> None:
        """Ends the download. The owner deletes the temporary file unless it became the entry, and its chunk
        table, then lets go of the download's lock; a process that joined it reads on what landed and
        downloads what its reads need into its still open (perhaps deleted) file."""
        with self._mutex:
            if self._finished.is_set():
                return
            self._finished.set()
        if not self.owner:
            return
        if not keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._temp)
        self._table.remove()  # before the lock: a table at its path is always its download lock holder's
        os.close(self._lock_descriptor)  # another process waiting for this entry finds it (or downloads it) now


def _close_both(descriptor: int, table: ChunkTable) -> None:
    os.close(descriptor)
    table.close()
