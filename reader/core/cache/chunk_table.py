"""Which chunks of a cache download have landed, shared by every process of a host that reads the shard.

A process that opens a shard another process is downloading into the cache
(``reader.core.cache.shard_cache``) used to wait for the whole download; with 1 GB
shards and eight processes per host that was seconds before anyone's first
batch. The downloader now publishes this table beside the download's
temporary file, and the processes reading the shard meanwhile download
chunks into the same file together:

- the table's header names the temporary file and the chunk size; it is
  written whole under another name and renamed into place, so a reader never
  sees half a header, and its owner deletes it when the download ends;
- each chunk has a record: its CRC32C, then a landed flag, written in that
  order after the chunk's bytes are in the temporary file (the page cache is
  one for every process of the host, so a flag read set means the bytes and
  the CRC32C are there);
- a process downloads a chunk only holding the chunk's claim: a write lock on
  its record's first byte. The locks are Linux open-file-description locks
  (``F_OFD_SETLK``): the kernel drops them when the process ends however it
  ends (a claim never outlives its downloader), and two tables opened in one
  process conflict as two processes' do (POSIX record locks would not).

Where the platform has no OFD locks (they are Linux's), ``SHARED`` is False:
a claim always succeeds, and nobody joins a download (``reader.core.cache.shard_cache``
then waits for the finished entry, as before tables).

Nothing here knows about downloads (``reader.core.cache.shard_fill`` does); this is
the table and its locks only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import uuid

#: Magic, chunk size, chunk count, the temporary file's name (UTF-8, NUL-padded, any name a directory holds:
#: it lies beside the table).
_HEADER = struct.Struct("<8sQQ256s")
_MAGIC = b"SNAPCHK1"
#: A chunk's record: its CRC32C, then whether it landed (1). Written in two writes, the flag last.
_RECORD = struct.Struct("<II")
_CRC = struct.Struct("<I")
_LANDED = struct.Struct("<I")
#: Whether claims exclude other processes here, so that downloads can be joined.
SHARED = hasattr(fcntl, "F_OFD_SETLK")
#: ``struct flock`` on Linux x86-64 and aarch64: type, whence, start, length, pid (0 for OFD locks), padding.
_FLOCK = struct.Struct("hhqqi4x")


class ChunkTable:
    """One download's table, opened by its owner (``create``) or by a process joining it (``join``)."""

    def __init__(self, path: str, descriptor: int, temp_name: str, chunk_bytes: int, chunks: int) -> None:
        self._path = path
        self._descriptor = descriptor
        self.temp_name = temp_name
        self.chunk_bytes = chunk_bytes
        self.chunks = chunks

    @classmethod
    def create(cls, path: str, temp_name: str, chunk_bytes: int, chunks: int) -> ChunkTable:
        """A new table at ``path`` with no chunk landed (replacing any a process that ended left there)."""
        encoded = temp_name.encode()
        staged = f"{path}.{uuid.uuid4().hex[:12]}"
        descriptor = os.open(staged, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        try:
            os.pwrite(descriptor, _HEADER.pack(_MAGIC, chunk_bytes, chunks, encoded), 0)
            os.ftruncate(descriptor, _HEADER.size + chunks * _RECORD.size)
            os.rename(staged, path)
        except BaseException:
            os.close(descriptor)
            with contextlib.suppress(OSError):
                os.unlink(staged)
            raise
        return cls(path, descriptor, temp_name, chunk_bytes, chunks)

    @classmethod
    def join(cls, path: str) -> ChunkTable | None:
        """The table at ``path``; None when there is none (no download publishes one) or it is not whole."""
        try:
            descriptor = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            header = os.pread(descriptor, _HEADER.size, 0)
            if len(header) == _HEADER.size:
                magic, chunk_bytes, chunks, encoded = _HEADER.unpack(header)
                if magic == _MAGIC and os.fstat(descriptor).st_size == _HEADER.size + chunks * _RECORD.size:
                    return cls(path, descriptor, encoded.rstrip(b"\0").decode(), chunk_bytes, chunks)
        except BaseException:
            os.close(descriptor)
            raise
        os.close(descriptor)
        return None

    def _record(self, chunk: int) -> int:
        return _HEADER.size + chunk * _RECORD.size

    def landed(self, chunk: int) -> int | None:
        """The chunk's CRC32C when it has landed in the temporary file, else None."""
        crc, flag = _RECORD.unpack(os.pread(self._descriptor, _RECORD.size, self._record(chunk)))
        return crc if flag == 1 else None

    def mark_landed(self, chunk: int, crc32c: int) -> None:
        """Records a chunk whose bytes are in the temporary file: its CRC32C first, the flag after it."""
        os.pwrite(self._descriptor, _CRC.pack(crc32c), self._record(chunk))
        os.pwrite(self._descriptor, _LANDED.pack(1), self._record(chunk) + _CRC.size)

    def claim(self, chunk: int, *, wait: bool) -> bool:
        """Takes the chunk's claim (no other table holds it); ``wait``: until the holder lets go or ends
        (GIL released), else False when another holds it now."""
        if not SHARED:
            return True  # nobody joins: this table is its owner's alone
        lock = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, self._record(chunk), 1, 0)
        try:
            fcntl.fcntl(self._descriptor, fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK, lock)
        except OSError as exc:
            if not wait and exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def release(self, chunk: int) -> None:
        if not SHARED:
            return
        fcntl.fcntl(
            self._descriptor, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, self._record(chunk), 1, 0)
        )

    def remove(self) -> None:
        """Deletes the table's file (its owner, when the download ends): processes that joined keep theirs open."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)

    def close(self) -> None:
        """Closes the table (every claim it holds let go)."""
        os.close(self._descriptor)
