"""What every object store shares: keys under a bucket, "directories" that are key prefixes, and
conditional single-object writes as the commit primitives.

A backend (``gcs``, ``s3``) supplies six small operations on its native client
(list, head, get with a version, conditional put, delete, and a pyarrow
filesystem for streaming data), and may answer two reads faster than its
native client does (``_read`` without a version, ``_has_children``);
everything the commit protocol relies on is built here once, on top of them:

- listings derive child folders from key prefixes (a folder Beam or another
  writer made has no marker object: pyarrow's non-recursive GCS listing misses
  it, apache/arrow#35993);
- deletes tolerate objects already gone (a retried or racing delete must not fail);
- ``create_exclusive`` and ``compare_and_swap`` return False on a precondition
  failure. That failure may answer a retry of *our own* write whose first
  response was lost: the commit protocol therefore re-reads the marker and
  counts a marker naming its own run as committed (``beam_jobs.writing.commit``).
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import threading

from schemas import paths
from schemas.errors import StorageError
from schemas.stores.base import Entry, Store

#: Deletes of many objects (a run folder) go out this many at a time.
_DELETE_CONCURRENCY = 16


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float


@dataclasses.dataclass(frozen=True)
class Listing:
    objects: list[ObjectInfo]
    prefixes: list[str]  # child "folders", each ending in "/"


class _ObjectOutput:
    """pyarrow's streaming upload: the object appears when ``close`` completes it."""

    def __init__(self, stream, store: ObjectStore, path: str) -> None:
        self._stream = stream
        self._store = store
        self._path = path

    def write(self, data) -> int:
        return self._stream.write(data)

    def tell(self) -> int:
        return self._stream.tell()

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        try:
            self._stream.close()
        except OSError as exc:
            raise StorageError(f"cannot write {self._path}: {exc}") from exc

    def abort(self) -> None:
        """pyarrow cannot cancel an upload: complete it, then delete what it published."""
        try:
            self._stream.close()
        except OSError:
            return  # nothing was published
        self._store.delete_file(self._path)


class ObjectStore(Store):
    scheme: str = ""

    def __init__(self, client=None, filesystem=None) -> None:
        """``client`` (the store's native client: google-cloud-storage, boto3) and ``filesystem`` (pyarrow)
        are made on first use unless given (tests inject them)."""
        self._client_instance = client
        self._filesystem_instance = filesystem
        self._checked_buckets: set[str] = set()
        self._check_lock = threading.Lock()

    # -- what a backend supplies ---------------------------------------------------------------------
    @abc.abstractmethod
    def _list(self, bucket: str, prefix: str, *, recursive: bool) -> Listing: ...

    @abc.abstractmethod
    def _head(self, bucket: str, key: str) -> ObjectInfo | None: ...

    @abc.abstractmethod
    def _get(self, bucket: str, key: str) -> tuple[bytes, object] | None:
        """The object's bytes and the version they belong to (a GCS generation, an S3 ETag); None if missing."""

    @abc.abstractmethod
    def _put(self, bucket: str, key: str, data: bytes, *, if_absent: bool = False, if_version: object = None) -> bool:
        """Uploads in one request; False when the precondition (absent / still at ``if_version``) fails."""

    @abc.abstractmethod
    def _delete(self, bucket: str, key: str) -> None:
        """Deletes one object; a missing one is fine."""

    @abc.abstractmethod
    def _filesystem(self):
        """The pyarrow filesystem for streaming reads and writes of large objects."""

    @abc.abstractmethod
    def _check_bucket(self, bucket: str, key: str) -> None:
        """One quick request, no retries: raises StorageError naming what is wrong (credentials, bucket, endpoint)."""

    # -- what a backend may answer faster than its native client -------------------------------------
    def _read(self, bucket: str, key: str) -> bytes | None:
        """The object's bytes (None if missing), where no version is needed."""
        got = self._get(bucket, key)
        return None if got is None else got[0]

    def _has_children(self, bucket: str, key: str) -> bool:
        """Whether any object lies under ``key/``."""
        listing = self._list(bucket, key + "/", recursive=False)
        return bool(listing.objects or listing.prefixes)

    # -- the interface, built once ---------------------------------------------------------------
    def split(self, path: str) -> tuple[str, str]:
        """``gs://bucket/a/b/`` -> ("bucket", "a/b"); the bucket is checked on first use in this process."""
        rest = path[len(self.scheme) + 3 :]
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise StorageError(f"{path} names no bucket: write {self.scheme}://<bucket>/<folder>.")
        key = key.strip("/")
        if bucket not in self._checked_buckets:
            with self._check_lock:
                if bucket not in self._checked_buckets:
                    try:
                        self._check_bucket(bucket, key)
                    except StorageError as exc:
                        if f"{self.scheme}://{bucket}" in str(exc):
                            raise
                        raise StorageError(f"{path}: {exc}") from exc  # credentials: name the path too
                    self._checked_buckets.add(bucket)
        return bucket, key

    def _arrow_path(self, path: str) -> str:
        bucket, key = self.split(path)
        return f"{bucket}/{key}"

    def check_credentials(self, path: str) -> None:
        self.split(path)

    def exists(self, path: str) -> bool:
        return self.is_file(path) or self.is_dir(path)

    def is_file(self, path: str) -> bool:
        bucket, key = self.split(path)
        return bool(key) and self._head(bucket, key) is not None

    def is_dir(self, path: str) -> bool:
        bucket, key = self.split(path)
        if not key:
            return True  # the bucket itself (split checked that it exists)
        return self._has_children(bucket, key)

    def read_bytes(self, path: str) -> bytes:
        bucket, key = self.split(path)
        data = self._read(bucket, key)
        if data is None:
            raise FileNotFoundError(f"no such object: {path}")
        return data

    def file_size(self, path: str) -> int:
        bucket, key = self.split(path)
        info = self._head(bucket, key)
        if info is None:
            raise FileNotFoundError(f"no such object: {path}")
        return info.size

    def open_random_access(self, path: str):
        return self._filesystem().open_input_file(self._arrow_path(path))

    def list_dir(self, path: str) -> list[Entry]:
        bucket, key = self.split(path)
        prefix = f"{key}/" if key else ""
        listing = self._list(bucket, prefix, recursive=False)
        base = path.rstrip("/")
        entries = [
            Entry(paths.join(base, name), name, False, info.size, info.mtime)
            for info in listing.objects
            if (name := info.key[len(prefix) :])  # "" is a folder's own marker object
        ]
        for child in listing.prefixes:
            name = child[len(prefix) :].rstrip("/")
            entries.append(Entry(paths.join(base, name), name, True, 0, 0.0))
        return entries

    def make_dirs(self, path: str) -> None:
        """Object stores have no folders: a key's prefixes exist once an object is written under them."""
        self.split(path)

    def delete_file(self, path: str) -> None:
        bucket, key = self.split(path)
        self._delete(bucket, key)

    def delete_tree(self, path: str) -> None:
        bucket, key = self.split(path)
        if not key:
            raise StorageError(f"refusing to delete the whole bucket {path}")
        keys = [info.key for info in self._list(bucket, key + "/", recursive=True).objects]
        with concurrent.futures.ThreadPoolExecutor(_DELETE_CONCURRENCY) as pool:
            list(pool.map(lambda k: self._delete(bucket, k), keys))

    def atomic_write(self, path: str, data: bytes) -> None:
        """A single-object upload is atomic: readers see the old object or the new one."""
        bucket, key = self.split(path)
        self._put(bucket, key, data)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        bucket, key = self.split(path)
        return self._put(bucket, key, data, if_absent=True)

    def compare_and_swap(self, path: str, expected: bytes, data: bytes) -> bool:
        bucket, key = self.split(path)
        current = self._get(bucket, key)
        if current is None or current[0] != expected:
            return False
        return self._put(bucket, key, data, if_version=current[1])

    def open_output(self, path: str) -> _ObjectOutput:
        arrow_path = self._arrow_path(path)
        try:
            stream = self._filesystem().open_output_stream(arrow_path)
        except OSError as exc:
            raise StorageError(f"cannot write {path}: {exc}") from exc
        return _ObjectOutput(stream, self, path)
