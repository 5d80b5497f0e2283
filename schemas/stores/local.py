"""The local filesystem (and ``file://``): POSIX atomicity with fsync, ``link(2)`` and ``flock``."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid

import pyarrow as pa

from schemas import paths
from schemas.errors import StorageError
from schemas.stores.base import Entry, Store


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _temp_sibling(local: str) -> str:
    return paths.temp_name_for(local, uuid.uuid4().hex[:12])


def _write_temp(local: str, data: bytes) -> str:
    temp = _temp_sibling(local)
    with open(temp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    return temp


@contextlib.contextmanager
def _locked_directory(directory: str):
    """Holds an exclusive ``flock`` on ``directory``; closing the descriptor releases it."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read_or_none(local: str) -> bytes | None:
    try:
        with open(local, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


class _LocalOutput:
    """Written under a temp sibling name, fsynced and renamed into place on close."""

    def __init__(self, local: str) -> None:
        self._final = local
        self._temp = _temp_sibling(local)
        self._handle = open(self._temp, "wb")  # noqa: SIM115 - closed in close()/abort()

    def write(self, data) -> int:
        return self._handle.write(data)

    def tell(self) -> int:
        return self._handle.tell()

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self._temp, self._final)
        _fsync_dir(os.path.dirname(self._final))

    def abort(self) -> None:
        self._handle.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._temp)


class LocalStore(Store):
    name = "local disk"

    def local_path(self, path: str) -> str:
        local = path[len("file://") :] if path.startswith("file://") else path
        return os.path.abspath(local)

    def exists(self, path: str) -> bool:
        return os.path.exists(self.local_path(path))

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self.local_path(path))

    def is_file(self, path: str) -> bool:
        return os.path.isfile(self.local_path(path))

    def read_bytes(self, path: str) -> bytes:
        with open(self.local_path(path), "rb") as handle:
            return handle.read()

    def file_size(self, path: str) -> int:
        return os.stat(self.local_path(path)).st_size

    def open_random_access(self, path: str):
        return pa.OSFile(self.local_path(path), "rb")

    def list_dir(self, path: str) -> list[Entry]:
        try:
            scanned = list(os.scandir(self.local_path(path)))
        except (FileNotFoundError, NotADirectoryError):
            return []
        entries = []
        for item in scanned:
            try:
                stat = item.stat()
            except FileNotFoundError:
                continue  # removed while listing
            is_dir = item.is_dir()
            entries.append(
                Entry(paths.join(path, item.name), item.name, is_dir, 0 if is_dir else stat.st_size, stat.st_mtime)
            )
        return entries

    def make_dirs(self, path: str) -> None:
        try:
            os.makedirs(self.local_path(path), exist_ok=True)
        except OSError as exc:
            raise StorageError(
                f"cannot create directory {path}: {exc.strerror}. Check that the output root exists and is writable."
            ) from exc

    def delete_file(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.local_path(path))

    def delete_tree(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(self.local_path(path))

    def atomic_write(self, path: str, data: bytes) -> None:
        """Temp name in the same directory, fsync, rename, fsync the directory."""
        local = self.local_path(path)
        try:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            temp = _write_temp(local, data)
            os.replace(temp, local)
            _fsync_dir(os.path.dirname(local))
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}") from exc

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """``link(2)`` of a fully written temp file: atomic, and fails on an existing name."""
        local = self.local_path(path)
        temp = _write_temp(local, data)
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

    def compare_and_swap(self, path: str, expected: bytes, data: bytes) -> bool:
        """Compares and renames under an exclusive ``flock`` of the parent directory.

        The kernel drops the lock when its holder exits or dies, so a crashed
        writer leaves no stale lock behind; the one gap is a filesystem that
        ignores ``flock`` (some NFS mounts), where compare and rename are no
        longer one step.
        """
        local = self.local_path(path)
        try:
            with _locked_directory(os.path.dirname(local)):
                if _read_or_none(local) != expected:
                    return False
                self.atomic_write(path, data)
        except OSError as exc:
            raise StorageError(f"cannot replace {path}: {exc}") from exc
        return True

    def open_output(self, path: str) -> _LocalOutput:
        local = self.local_path(path)
        try:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            return _LocalOutput(local)
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc.strerror or exc}") from exc
