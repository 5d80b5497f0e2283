"""A cache entry's record that its bytes matched the manifest, kept on the entry itself (a user xattr).

Checking an entry's CRC32C reads all of it: every new process of a host (a
new training job, each DataLoader worker) doing that before its first batch
made later epochs from the cache much slower than the warm local reader
(docs/architecture.md §9.4). The download checks it once and
records the CRC32C and size that matched with the file's mtime then; writing
into the file changes its mtime, so a record that still matches says the bytes
are the ones checked. What the record cannot see (bytes changed with the mtime
put back, the disk's own bit rot) ``verify_checksums=True`` catches: entries are
checked again in every process then.
"""

from __future__ import annotations

import contextlib
import os

XATTR = "user.snapfeed.checked"


def record_of(crc32c: int, size: int, stat: os.stat_result) -> bytes:
    """The record of a file whose ``size`` bytes matched ``crc32c`` while it had ``stat``."""
    return f"{crc32c:08x} {size} {stat.st_mtime_ns}".encode()


def record(descriptor: int, crc32c: int, size: int, stat: os.stat_result) -> None:
    """Records that the open file matched (nothing on a disk without user xattrs: each process checks it)."""
    with contextlib.suppress(OSError):
        os.setxattr(descriptor, XATTR, record_of(crc32c, size, stat))


def recorded(descriptor: int) -> bytes | None:
    """The open file's record; None when it has none (or its disk keeps no xattrs)."""
    try:
        return os.getxattr(descriptor, XATTR)
    except OSError:
        return None
