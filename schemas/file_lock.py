"""A file locked with ``flock`` for the length of a block: the one spelling of it that the reader's shard cache and the
job's sdist build share.

``flock`` is used, not a lock file created exclusively, because the kernel drops it with the process however the
process ends: a killed holder never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os


@contextlib.contextmanager
def locked(path: str | os.PathLike, operation: int = fcntl.LOCK_EX):
    """``path`` (created when missing) locked with ``flock(operation)`` for the block."""
    descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(descriptor, operation)
        yield
    finally:
        os.close(descriptor)
