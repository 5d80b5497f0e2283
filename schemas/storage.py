"""File operations on snapshots by path, shared by the job, the reader and tools.

Each call goes to the store that serves the path's scheme (``schemas.stores``:
local disk, ``gs://``, ``s3://``), which implements the one no-overwrite create
that commits ``metadata.final`` (docs/architecture.md §2.3, commit protocol
step 3) and the one compare-and-swap that replaces it in a forced write (step 4).
Temp names are hidden from listings unless asked for, and an output root is
checked before any work.
"""

from __future__ import annotations

import uuid

from schemas import paths
from schemas.errors import StorageError
from schemas.stores import Entry, OutputFile, store_for

__all__ = [
    "Entry",
    "OutputFile",
    "atomic_write",
    "check_output_root",
    "compare_and_swap",
    "create_exclusive",
    "delete_file",
    "delete_tree",
    "exists",
    "file_size",
    "is_dir",
    "list_dir",
    "local_path",
    "make_dirs",
    "open_output",
    "open_random_access",
    "read_bytes",
]


def local_path(path: str) -> str | None:
    """The absolute local path when ``path`` is on the local filesystem, else None."""
    return store_for(path).local_path(path)


def exists(path: str) -> bool:
    return store_for(path).exists(path)


def is_dir(path: str) -> bool:
    return store_for(path).is_dir(path)


def read_bytes(path: str) -> bytes:
    return store_for(path).read_bytes(path)


def open_random_access(path: str):
    """A seekable pyarrow file: what Arrow IPC file readers need for block access."""
    return store_for(path).open_random_access(path)


def file_size(path: str) -> int:
    return store_for(path).file_size(path)


def list_dir(path: str, *, include_temp: bool = False) -> list[Entry]:
    """Entries directly under ``path`` sorted by name; [] if missing.

    Temp names are skipped unless ``include_temp`` (only cleanup wants them).
    """
    entries = store_for(path).list_dir(path)
    return sorted((e for e in entries if include_temp or not paths.is_temp_name(e.name)), key=lambda e: e.name)


def make_dirs(path: str) -> None:
    store_for(path).make_dirs(path)


def delete_file(path: str) -> None:
    """A file already gone is fine."""
    store_for(path).delete_file(path)


def delete_tree(path: str) -> None:
    """Removes a directory and everything in it; a missing directory is fine."""
    store_for(path).delete_tree(path)


def atomic_write(path: str, data: bytes) -> None:
    """Writes ``data`` so readers see the old content or the new, never a torn file."""
    store_for(path).atomic_write(path, data)


def create_exclusive(path: str, data: bytes) -> bool:
    """Creates ``path`` with ``data`` only if it does not exist; False if it did.

    This is the no-overwrite primitive that closes the check-then-write window
    of the RFC's finalize: two writers may both pass the run-id check, but only
    one ``create_exclusive`` of ``metadata.final`` can succeed. False may also
    answer a retry of our own create whose first response was lost: callers
    re-read the file to tell the two apart.
    """
    return store_for(path).create_exclusive(path, data)


def compare_and_swap(path: str, expected: bytes, data: bytes) -> bool:
    """Replaces ``path`` with ``data`` only if it still holds ``expected``; False otherwise (re-read, as above).

    The swap of a forced write (docs/architecture.md §2.3 step 4): several writers
    superseding the same finalized run all read the same marker, but only the
    first swap still finds the bytes it read, so at most one replaces it.
    A missing ``path`` never matches.
    """
    return store_for(path).compare_and_swap(path, expected, data)


def open_output(path: str) -> OutputFile:
    """A new file that appears under ``path`` only when closed (``abort`` discards it): shards."""
    return store_for(path).open_output(path)


def check_reachable(path: str) -> None:
    """Fails within seconds, naming ``path`` and what to do, when its store cannot be reached (credentials,
    bucket, endpoint); checked once per bucket and process, nothing to check on local disk."""
    store_for(path).check_credentials(path)


def check_output_root(root: str) -> None:
    """Fails early, before any work, when ``root`` cannot host a committed snapshot.

    Reaches the store (credentials, bucket, endpoint), refuses a root that is a
    file, creates the root if needed and writes then removes a probe file, so a
    read-only or mistyped root is reported before a long pipeline runs.
    """
    store = store_for(root)
    store.check_credentials(root)
    if store.is_file(root):
        raise StorageError(f"output root {root} is a file, not a folder: choose a folder for --output.")
    store.make_dirs(root)
    probe = paths.join(root, f"{paths.TEMP_PREFIX}probe-{uuid.uuid4().hex[:12]}")
    try:
        store.atomic_write(probe, b"")
    except StorageError as exc:
        raise StorageError(f"output root {root} is not writable ({exc}). Choose a writable --output.") from exc
    store.delete_file(probe)
