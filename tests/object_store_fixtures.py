"""pytest fixtures for local object stores (``testing.object_stores``): an S3 and a GCS emulator per session.

Load with ``pytest_plugins = ["tests.object_store_fixtures"]`` in the top-level
conftest. ``s3_bucket`` / ``gcs_bucket`` create a fresh bucket per test, set the
emulator's environment with monkeypatch (boto3, pyarrow, Beam and
google-cloud-storage in this process, and subprocesses started with
``os.environ``, reach it), yield ``s3://NAME`` / ``gs://NAME``, and delete the
bucket and its objects afterwards. ``s3_emulator.env`` / ``gcs_emulator.env``
are the same variables for a subprocess or worker pool's ``env``. Both also drop
the stores ``schemas.stores`` made before (clients of another environment).

``object_store`` runs a test once per store (ids ``s3`` and ``gs``): the same
fresh bucket and environment, described by an ``ObjectStore`` (``root``,
``scheme``, ``bucket``, ``endpoint``, ``env``, ``env_via(proxy_endpoint)``, ``tmp_path``).
``proxied`` puts a counting ``testing.http_proxy`` in front of that store and
yields ``(object_store.copy_in, proxy)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import uuid
from collections.abc import Iterator

import pytest

from schemas import stores
from testing.http_proxy import http_proxy
from testing.object_stores import GcsServer, S3Server, gcs_server, s3_server


@pytest.fixture(scope="session")
def s3_emulator() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 for the whole session."""
    with s3_server() as server:
        yield server


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GcsServer]:
    """fake-gcs-server (and its fake OAuth token server and service-account key) for the whole session."""
    with gcs_server() as server:
        yield server


def unique_bucket_name() -> str:
    """A valid S3 and GCS bucket name no other test uses."""
    return f"snapfeed-{uuid.uuid4().hex[:20]}"


def _fresh_bucket(server: S3Server | GcsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    stores.forget()  # stores made earlier in this process hold clients of another environment
    name = unique_bucket_name()
    root = server.make_bucket(name)
    yield root
    with contextlib.suppress(Exception):  # best effort: a test may have deleted it, or left the server unhappy
        server.delete_bucket(name)


@pytest.fixture
def s3_bucket(s3_emulator: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``s3://NAME`` of a new, empty bucket, with the emulator's env set for this test."""
    yield from _fresh_bucket(s3_emulator, monkeypatch)


@pytest.fixture
def gcs_bucket(gcs_emulator: GcsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``gs://NAME`` of a new, empty bucket, with the emulator's env set for this test."""
    yield from _fresh_bucket(gcs_emulator, monkeypatch)


@dataclasses.dataclass(frozen=True)
class ObjectStore:
    """One emulator and a fresh bucket on it, as the ``object_store`` fixture yields them."""

    scheme: str  # "s3" or "gs"
    root: str  # s3://NAME or gs://NAME
    server: S3Server | GcsServer
    tmp_path: pathlib.Path  # the test's own tmp_path, for local counterparts

    @property
    def bucket(self) -> str:
        return self.root.split("://", 1)[1]

    @property
    def endpoint(self) -> str:
        return self.server.endpoint

    @property
    def env(self) -> dict[str, str]:
        return self.server.env

    def copy_in(self, local: str | pathlib.Path, name: str | None = None) -> str:
        """A local directory (a snapshot) copied into the bucket under ``name`` (default: its own); its URI."""
        import pyarrow.fs as pafs

        uri = f"{self.root}/{name or pathlib.Path(local).name}"
        filesystem, prefix = pafs.FileSystem.from_uri(uri)
        pafs.copy_files(str(local), prefix, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=filesystem)
        return uri

    def env_via(self, endpoint: str) -> dict[str, str]:
        """``env`` with every client sent to ``endpoint`` (a ``testing.http_proxy`` in front of the emulator)."""
        return self.server.env_via(endpoint)


@pytest.fixture(params=["s3", "gs"])
def object_store(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> ObjectStore:
    """The test once on S3 and once on GCS: a fresh bucket there, the emulator's env set (as ``s3_bucket``)."""
    if request.param == "s3":
        return ObjectStore("s3", request.getfixturevalue("s3_bucket"), request.getfixturevalue("s3_emulator"), tmp_path)
    return ObjectStore("gs", request.getfixturevalue("gcs_bucket"), request.getfixturevalue("gcs_emulator"), tmp_path)


@pytest.fixture
def proxied(object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch):
    """The store, with every client of this process (and its children) sent through a counting proxy:
    ``(object_store.copy_in, proxy)``."""
    with http_proxy(object_store.endpoint) as proxy:
        for name, value in object_store.env_via(proxy.endpoint).items():
            monkeypatch.setenv(name, value)
        stores.forget()
        yield object_store.copy_in, proxy
    stores.forget()  # their clients point at the closed proxy
