"""File operations on snapshot metadata, shared by the job, the reader and tools.

Built on ``pyarrow.fs`` (local, ``gs://``, ``s3://``) because the reader needs
pyarrow's random-access files anyway and must not import Beam. This module
holds the one atomic-write helper, the one no-overwrite create used to commit
``metadata.final`` (docs/architecture.md §2.3, commit protocol step 3) and the one
compare-and-swap used to replace it in a forced write (step 4).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import uuid

import pyarrow.fs as pafs

from schemas import paths
from schemas.errors import StorageError

#: Schemes whose store offers a no-overwrite create and a compare-and-swap, so at most one writer can commit.
COMMIT_SCHEMES = ("", "file", "gs")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One directory entry (temp names are never returned)."""

    path: str
    name: str
    is_dir: bool
    size: int
    mtime: float


def _resolve(path: str) -> tuple[pafs.FileSystem, str]:
    if not paths.scheme(path) or paths.scheme(path) == "file":
        local = path[len("file://") :] if path.startswith("file://") else path
        return pafs.LocalFileSystem(), os.path.abspath(local)
    try:
        return pafs.FileSystem.from_uri(path)
    except (ValueError, OSError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise StorageError(f"cannot open filesystem for {path}: {exc}") from exc


def local_path(path: str) -> str | None:
    """The absolute local path when ``path`` is on the local filesystem, else None."""
    fs, resolved = _resolve(path)
    return resolved if isinstance(fs, pafs.LocalFileSystem) else None


def exists(path: str) -> bool:
    fs, resolved = _resolve(path)
    return fs.get_file_info(resolved).type != pafs.FileType.NotFound


def is_dir(path: str) -> bool:
    fs, resolved = _resolve(path)
    return fs.get_file_info(resolved).type == pafs.FileType.Directory


def read_bytes(path: str) -> bytes:
    fs, resolved = _resolve(path)
    with fs.open_input_stream(resolved) as stream:
        return stream.read()


def open_random_access(path: str):
    """A seekable pyarrow file: what Arrow IPC file readers need for block access."""
    fs, resolved = _resolve(path)
    return fs.open_input_file(resolved)


def file_size(path: str) -> int:
    fs, resolved = _resolve(path)
    info = fs.get_file_info(resolved)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(errno.ENOENT, "no such file", path)
    return info.size


def list_dir(path: str, *, include_temp: bool = False) -> list[Entry]:
    """Entries directly under ``path`` sorted by name; [] if missing.

    Temp names are skipped unless ``include_temp`` (only cleanup wants them).
    """
    fs, resolved = _resolve(path)
    selector = pafs.FileSelector(resolved, allow_not_found=True, recursive=False)
    entries = []
    for info in fs.get_file_info(selector):
        if paths.is_temp_name(info.base_name) and not include_temp:
            continue
        mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
        entries.append(
            Entry(
                path=paths.join(path, info.base_name),
                name=info.base_name,
                is_dir=info.type == pafs.FileType.Directory,
                size=info.size or 0,
                mtime=mtime,
            )
        )
    return sorted(entries, key=lambda e: e.name)


def make_dirs(path: str) -> None:
    fs, resolved = _resolve(path)
    try:
        fs.create_dir(resolved, recursive=True)
    except OSError as exc:
        raise StorageError(
            f"cannot create directory {path}: {exc}. Check that the output root exists and is writable."
        ) from exc


def delete_file(path: str) -> None:
    fs, resolved = _resolve(path)
    try:
        fs.delete_file(resolved)
    except FileNotFoundError:
        pass


def delete_tree(path: str) -> None:
    """Removes a directory and everything in it; a missing directory is fine."""
    fs, resolved = _resolve(path)
    if fs.get_file_info(resolved).type == pafs.FileType.NotFound:
        return
    fs.delete_dir(resolved)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_local_temp(local_path: str, data: bytes) -> str:
    temp = paths.temp_name_for(local_path, uuid.uuid4().hex[:12])
    with open(temp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return temp


def atomic_write(path: str, data: bytes) -> None:
    """Writes ``data`` so readers see the old content or the new, never a torn file.

    Local: temp name in the same directory, fsync, rename, fsync the directory.
    Object stores: a single-object upload is already atomic.
    """
    local = local_path(path)
    try:
        if local is None:
            fs, resolved = _resolve(path)
            with fs.open_output_stream(resolved) as stream:
                stream.write(data)
            return
        os.makedirs(os.path.dirname(local), exist_ok=True)
        temp = _write_local_temp(local, data)
        os.replace(temp, local)
        _fsync_dir(os.path.dirname(local))
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc}") from exc


def create_exclusive(path: str, data: bytes) -> bool:
    """Creates ``path`` with ``data`` only if it does not exist; False if it did.

    This is the no-overwrite primitive that closes the check-then-write window
    of the RFC's finalize: two writers may both pass the run-id check, but only
    one ``create_exclusive`` of ``metadata.final`` can succeed. Local files use
    ``link(2)`` (atomic, fails on an existing name); ``gs://`` uses a
    generation-match-0 precondition.
    """
    scheme = paths.scheme(path)
    if scheme == "gs":
        return _create_exclusive_gcs(path, data)
    local = local_path(path)
    if local is None:
        raise StorageError(
            f"cannot commit {path}: the {scheme}:// store has no no-overwrite create here. "
            f"Write snapshots to local disk or gs://."
        )
    temp = _write_local_temp(local, data)
    try:
        os.link(temp, local)
    except FileExistsError:
        return False
    except OSError as exc:
        raise StorageError(f"cannot create {path}: {exc}") from exc
    finally:
        os.unlink(temp)
    _fsync_dir(os.path.dirname(local))
    return True


def _create_exclusive_gcs(path: str, data: bytes) -> bool:  # pragma: no cover - needs GCS
    from google.api_core import exceptions as gexc
    from google.cloud import storage as gcs

    bucket_name, _, blob_name = path[len("gs://") :].partition("/")
    blob = gcs.Client().bucket(bucket_name).blob(blob_name)
    try:
        blob.upload_from_string(data, if_generation_match=0)
    except gexc.PreconditionFailed:
        return False
    return True


def compare_and_swap(path: str, expected: bytes, data: bytes) -> bool:
    """Replaces ``path`` with ``data`` only if it still holds ``expected``; False otherwise.

    The swap of a forced write (docs/architecture.md §2.3 step 4): several writers
    superseding the same finalized run all read the same marker, but only the
    first swap still finds the bytes it read, so at most one replaces it.
    Readers never wait or see a torn file (the new content is renamed in).

    Local files compare and rename under an exclusive ``flock`` of the parent
    directory. The kernel drops it when the holder exits or dies, so a crashed
    writer leaves no stale lock behind to block later ones; the one gap is a
    filesystem that ignores ``flock`` (some NFS mounts), where the compare and
    the rename are no longer one step. ``gs://`` uses a generation-match
    precondition on the object it compared. A missing ``path`` never matches.
    """
    if paths.scheme(path) == "gs":
        return _compare_and_swap_gcs(path, expected, data)
    local = local_path(path)
    if local is None:
        raise StorageError(
            f"cannot replace {path}: the {paths.scheme(path)}:// store has no compare-and-swap here. "
            f"Write snapshots to local disk or gs://."
        )
    try:
        with _locked_directory(os.path.dirname(local)):
            if _read_local(local) != expected:
                return False
            atomic_write(local, data)
    except OSError as exc:
        raise StorageError(f"cannot replace {path}: {exc}") from exc
    return True


@contextlib.contextmanager
def _locked_directory(directory: str):
    """Holds an exclusive ``flock`` on ``directory``; closing the descriptor releases it."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_local(local_path: str) -> bytes | None:
    """The file's bytes, or None if missing."""
    try:
        with open(local_path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _compare_and_swap_gcs(path: str, expected: bytes, data: bytes) -> bool:  # pragma: no cover - needs GCS
    from google.api_core import exceptions as gexc
    from google.cloud import storage as gcs

    bucket_name, _, blob_name = path[len("gs://") :].partition("/")
    blob = gcs.Client().bucket(bucket_name).get_blob(blob_name)
    if blob is None:
        return False
    try:
        if blob.download_as_bytes(if_generation_match=blob.generation) != expected:
            return False
        blob.upload_from_string(data, if_generation_match=blob.generation)
    except (gexc.PreconditionFailed, gexc.NotFound):
        return False
    return True


def check_output_root(root: str) -> None:
    """Fails early, before any work, when ``root`` cannot host a committed snapshot.

    Creates the root if needed and writes then removes a probe file, so a
    read-only or mistyped root is reported before a long pipeline runs.
    """
    if paths.scheme(root) not in COMMIT_SCHEMES:
        raise StorageError(
            f"output root {root}: snapshots can only be committed on local disk or gs:// "
            f"(the {paths.scheme(root)}:// store offers no no-overwrite create here)."
        )
    make_dirs(root)
    probe = paths.join(root, f"{paths.TEMP_PREFIX}probe-{uuid.uuid4().hex[:12]}")
    try:
        atomic_write(probe, b"")
    except StorageError as exc:
        raise StorageError(f"output root {root} is not writable ({exc}). Choose a writable --output.") from exc
    delete_file(probe)
