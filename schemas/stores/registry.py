"""Which store serves a path: one backend per URI scheme, made once per process (as Beam's ``filesystems.py``)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

from schemas import extras, paths
from schemas.errors import StorageError
from schemas.stores.base import Store


def _local() -> Store:
    from schemas.stores.local import LocalStore

    return LocalStore()


def _gcs() -> Store:
    extras.check("google.auth", "a gs:// path")
    extras.check("google.cloud.storage", "a gs:// path")
    from schemas.stores.gcs import GcsStore

    return GcsStore()


def _s3() -> Store:
    extras.check("boto3", "an s3:// path")
    from schemas.stores.s3 import S3Store

    return S3Store()


_FACTORIES: dict[str, Callable[[], Store]] = {"": _local, "file": _local, "gs": _gcs, "s3": _s3}
_stores: dict[tuple[int, str], Store] = {}
_lock = threading.Lock()


def supported_schemes() -> str:
    return "local paths, " + ", ".join(f"{s}://" for s in _FACTORIES if s)


def store_for(path: str) -> Store:
    """The store for ``path``'s scheme. Clients are not shared across a fork: each process makes its own."""
    scheme = paths.scheme(path)
    if scheme not in _FACTORIES:
        raise StorageError(f"{path}: snapfeed has no store for {scheme}:// (it supports {supported_schemes()}).")
    key = (os.getpid(), scheme)
    store = _stores.get(key)
    if store is None:
        with _lock:
            store = _stores.setdefault(key, _FACTORIES[scheme]())
    return store


@contextlib.contextmanager
def using(scheme: str, store: Store) -> Iterator[Store]:
    """Serves ``scheme`` from ``store`` (clients injected, e.g. one that loses a response) in this process, then restores."""
    key = (os.getpid(), scheme)
    with _lock:
        previous = _stores.get(key)
        _stores[key] = store
    try:
        yield store
    finally:
        with _lock:
            if previous is None:
                _stores.pop(key, None)
            else:
                _stores[key] = previous


def forget() -> None:
    """Drops every store made so far (a test that changes the endpoint or credentials environment)."""
    with _lock:
        _stores.clear()
