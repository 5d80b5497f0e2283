"""The one storage interface (docs/architecture.md §2.3): what the commit protocol, the job and the reader need of a store.

A backend per URI scheme implements it (``local``, ``gs``, ``s3``), chosen by
``schemas.stores.store_for`` the way Beam's ``filesystems.py`` picks a
filesystem. Nothing outside a backend asks which scheme a path has.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Entry:
    """One directory entry. On object stores a "directory" is a key prefix: its mtime is 0 (unknown)."""

    path: str
    name: str
    is_dir: bool
    size: int
    mtime: float


class OutputFile(Protocol):
    """A file being written that appears under its final name only when ``close`` succeeds.

    ``abort`` discards it (no partial file is ever published under the final name
    on local disk; on object stores nothing was uploaded yet, or the upload is dropped).
    """

    def write(self, data) -> int: ...

    def tell(self) -> int: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


class Store(abc.ABC):
    """File operations on one kind of store. Paths are full paths or URIs of that store."""

    #: Shown in messages: "local disk", "gs://", "s3://".
    name: str = ""

    def local_path(self, path: str) -> str | None:
        """The absolute local path when the store is the local filesystem, else None."""
        return None

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """A file or a directory (on object stores: any object under the prefix) is there."""

    @abc.abstractmethod
    def is_dir(self, path: str) -> bool: ...

    @abc.abstractmethod
    def is_file(self, path: str) -> bool: ...

    @abc.abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """The whole file; FileNotFoundError when missing."""

    @abc.abstractmethod
    def file_size(self, path: str) -> int:
        """FileNotFoundError when missing."""

    @abc.abstractmethod
    def open_random_access(self, path: str):
        """A seekable pyarrow file (positioned ``read_at``): what Arrow IPC readers need."""

    @abc.abstractmethod
    def list_dir(self, path: str) -> list[Entry]:
        """Entries directly under ``path`` (files and child directories, temp names included); [] if missing."""

    @abc.abstractmethod
    def make_dirs(self, path: str) -> None: ...

    @abc.abstractmethod
    def delete_file(self, path: str) -> None:
        """Removes one file; a file already gone is fine (a retried delete must not fail)."""

    @abc.abstractmethod
    def delete_tree(self, path: str) -> None:
        """Removes a directory and everything in it; a missing one is fine."""

    @abc.abstractmethod
    def atomic_write(self, path: str, data: bytes) -> None:
        """Readers see the old content or the new, never a torn file."""

    @abc.abstractmethod
    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Creates ``path`` only if it does not exist; False if it did (or a retry of ours made it: callers re-read)."""

    @abc.abstractmethod
    def compare_and_swap(self, path: str, expected: bytes, data: bytes) -> bool:
        """Replaces ``path`` only if it still holds ``expected``; False otherwise (callers re-read, as above)."""

    @abc.abstractmethod
    def open_output(self, path: str) -> OutputFile:
        """A new file published atomically under ``path`` on ``close`` (shards)."""

    def check_credentials(self, path: str) -> None:  # noqa: B027 - local disk has nothing to check
        """Fails within seconds, naming what is missing, when the store cannot be reached with credentials."""
