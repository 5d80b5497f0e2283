"""The gs:// and s3:// backends against real emulators on 127.0.0.1 (moto's S3 server, fake-gcs-server).

Every primitive the commit protocol relies on, racing processes, a commit whose
response is lost and retried (a proxy drops it), and the one-line errors.
"""

import concurrent.futures
import multiprocessing
import os
import time

import pytest

from schemas import storage, stores
from schemas.errors import StorageError
from testing.http_proxy import http_proxy
from testing.object_stores import s3_server

STORES = ["s3", "gs"]


@pytest.fixture
def bucket(object_store) -> str:
    """A fresh bucket on one emulator, with the environment pointing every client at it."""
    return object_store.root


@pytest.fixture(autouse=True)
def fresh_stores():
    """Stores made by one test (clients at its endpoint) must not serve the next."""
    stores.forget()
    yield
    stores.forget()


def test_round_trip_and_folders_that_exist_only_as_key_prefixes(bucket):
    root = f"{bucket}/root"
    storage.check_output_root(root)
    storage.atomic_write(f"{root}/snap/run-1/shard-a-00000.arrow", b"hello")  # no folder marker objects
    assert [(e.name, e.is_dir) for e in storage.list_dir(root)] == [("snap", True)]
    assert [(e.name, e.is_dir) for e in storage.list_dir(f"{root}/snap")] == [("run-1", True)]
    assert [(e.name, e.size) for e in storage.list_dir(f"{root}/snap/run-1")] == [("shard-a-00000.arrow", 5)]
    assert storage.is_dir(f"{root}/snap") and not storage.is_dir(f"{root}/sna")
    assert storage.read_bytes(f"{root}/snap/run-1/shard-a-00000.arrow") == b"hello"
    assert storage.file_size(f"{root}/snap/run-1/shard-a-00000.arrow") == 5
    with storage.open_random_access(f"{root}/snap/run-1/shard-a-00000.arrow") as handle:
        assert handle.read_at(3, 1) == b"ell"
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(f"{root}/snap/missing")
    assert storage.list_dir(f"{root}/nothing-here") == []


def test_gcs_reads_that_pyarrow_cannot_make_are_made_by_google_cloud_storage(gcs_bucket, monkeypatch):
    """Reads go through pyarrow first (``schemas.stores.gcs``); where it fails, Google's client answers.
    Here pyarrow's filesystem points at a port nothing listens on, so every answer below is Google's."""
    import datetime

    import pyarrow.fs as pafs

    from schemas.stores.gcs import GcsStore
    from testing.ports import free_port

    storage.atomic_write(f"{gcs_bucket}/snap/run-1/shard-a-00000.arrow", b"hello")  # no folder marker objects
    with pytest.MonkeyPatch.context() as patch:  # pyarrow's client prefers the emulator's env to endpoint_override
        for name in ("STORAGE_EMULATOR_HOST", "CLOUD_STORAGE_EMULATOR_ENDPOINT"):
            patch.delenv(name)
        unreachable = pafs.GcsFileSystem(
            anonymous=True,
            scheme="http",
            endpoint_override=f"127.0.0.1:{free_port()}",
            retry_time_limit=datetime.timedelta(seconds=0.1),
        )
    with pytest.raises(OSError, match="UNAVAILABLE"):
        unreachable.get_file_info(f"{gcs_bucket.split('://')[1]}/snap")
    store = GcsStore()
    monkeypatch.setattr(GcsStore, "_arrow_filesystem", lambda self, retry_seconds: unreachable)
    assert store.read_bytes(f"{gcs_bucket}/snap/run-1/shard-a-00000.arrow") == b"hello"
    assert store.file_size(f"{gcs_bucket}/snap/run-1/shard-a-00000.arrow") == 5
    assert store.is_dir(f"{gcs_bucket}/snap/run-1") and not store.is_dir(f"{gcs_bucket}/sna")
    assert not store.is_file(f"{gcs_bucket}/snap/missing")
    with pytest.raises(FileNotFoundError):
        store.read_bytes(f"{gcs_bucket}/snap/missing")


def test_a_gcs_store_that_stops_answering_is_named_after_one_round_of_retries(gcs_emulator, gcs_bucket, monkeypatch):
    """pyarrow retries a metadata read for ``QUICK_RETRY_SECONDS`` only; Google's client then asks again,
    retrying for ``RETRY_SECONDS``, and names the failure in one line. Both retrying for ``RETRY_SECONDS``
    kept a reader whose store stopped answering mid-open waiting twice as long (here 15.7 s instead of 7.5)."""
    from schemas.stores import gcs

    monkeypatch.setattr(gcs, "RETRY_SECONDS", 6.0)
    marker = f"{gcs_bucket}/snap/metadata.final"
    storage.atomic_write(marker, b"run-1")
    with http_proxy(gcs_emulator.endpoint) as proxy:
        for name, value in gcs_emulator.env_via(proxy.endpoint).items():
            monkeypatch.setenv(name, value)
        store = gcs.GcsStore()
        assert store.read_bytes(marker) == b"run-1"  # the bucket checked, pyarrow's client made
        proxy.drop_response(lambda method, target, headers: "metadata.final" in target, times=1_000)
        started = time.monotonic()
        with pytest.raises(StorageError, match=rf"cannot reach Google Cloud Storage at .* for {marker}: check"):
            store.read_bytes(marker)
        waited = time.monotonic() - started
        assert proxy.stats()["responses_dropped"] >= 2, "pyarrow's and Google's clients each asked"
    assert waited < 10


def test_create_exclusive_and_compare_and_swap(bucket):
    marker = f"{bucket}/snap/metadata.final"
    assert storage.create_exclusive(marker, b"run-1") is True
    assert storage.create_exclusive(marker, b"run-2") is False
    assert storage.read_bytes(marker) == b"run-1"
    assert storage.compare_and_swap(marker, b"stale", b"run-3") is False
    assert storage.compare_and_swap(marker, b"run-1", b"run-3") is True
    assert storage.read_bytes(marker) == b"run-3"
    assert storage.compare_and_swap(f"{bucket}/snap/missing", b"", b"x") is False


def test_output_appears_only_when_closed_and_abort_leaves_nothing(bucket):
    shard = f"{bucket}/snap/run-1/shard-a-00000.arrow"
    output = storage.open_output(shard)
    output.write(b"x" * (6 << 20))  # larger than one upload part
    assert not storage.exists(shard)
    output.close()
    assert storage.file_size(shard) == 6 << 20
    aborted = storage.open_output(f"{bucket}/snap/run-1/shard-b-00000.arrow")
    aborted.write(b"y" * 1000)
    aborted.abort()
    assert [e.name for e in storage.list_dir(f"{bucket}/snap/run-1")] == ["shard-a-00000.arrow"]


def test_deletes_tolerate_objects_already_gone(bucket):
    for index in range(30):
        storage.atomic_write(f"{bucket}/snap/run-1/part-{index}", b"x")
    storage.delete_tree(f"{bucket}/snap/run-1")  # a folder with no marker object (what pyarrow's delete_dir 404s on)
    storage.delete_tree(f"{bucket}/snap/run-1")
    storage.delete_file(f"{bucket}/snap/run-1/part-0")
    assert storage.list_dir(f"{bucket}/snap") == []


def _create(path: str, token: str) -> str | None:
    stores.forget()  # a fresh process-local store, as a separate writer has
    return token if storage.create_exclusive(path, token.encode()) else None


def test_create_exclusive_has_one_winner_across_processes(bucket):
    marker = f"{bucket}/race/metadata.final"
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(8, mp_context=context) as pool:
        winners = [w for w in pool.map(_create, [marker] * 8, [f"writer-{i}" for i in range(8)]) if w]
    assert len(winners) == 1
    assert storage.read_bytes(marker) == winners[0].encode()


def test_bad_roots_are_one_line_within_seconds(bucket, tmp_path):
    name = bucket.split("://")[0]
    started = time.monotonic()
    with pytest.raises(
        StorageError,
        match=rf"bucket {name}://no-such-bucket does not exist \({name}://no-such-bucket/snapshots\): create it",
    ):
        storage.check_output_root(f"{name}://no-such-bucket/snapshots")
    storage.atomic_write(f"{bucket}/a-file", b"x")
    with pytest.raises(StorageError, match="is a file, not a folder"):
        storage.check_output_root(f"{bucket}/a-file")
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("scheme", STORES)
def test_an_unreachable_endpoint_fails_within_seconds(scheme, monkeypatch):
    with http_proxy("http://127.0.0.1:9") as proxy:  # nothing listens on the discard port
        endpoint = proxy.endpoint
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    started = time.monotonic()
    with pytest.raises(StorageError, match=rf"cannot reach .* for {scheme}://bucket/x: check the network"):
        storage.check_output_root(f"{scheme}://bucket/x")
    assert time.monotonic() - started < 15


@pytest.mark.parametrize("scheme", STORES)
def test_missing_credentials_fail_at_once_naming_what_to_set(scheme, monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_", "STORAGE_EMULATOR", "CLOUD_STORAGE")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    expected = "GOOGLE_APPLICATION_CREDENTIALS" if scheme == "gs" else "AWS_ACCESS_KEY_ID"
    started = time.monotonic()
    with pytest.raises(StorageError, match=rf"{scheme}://bucket/x: no (Google Cloud|AWS) credentials.*{expected}"):
        storage.check_output_root(f"{scheme}://bucket/x")
    assert time.monotonic() - started < 10


def test_a_store_that_refuses_the_credentials_is_one_line_naming_what_to_grant(monkeypatch):
    with s3_server(unauthenticated_requests=1) as server:
        root = server.make_bucket("guarded")  # the one request moto lets through before it checks keys
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        started = time.monotonic()
        with pytest.raises(StorageError, match=r"no permission for s3://guarded/snapshots \(.*\): grant"):
            storage.check_output_root(f"{root}/snapshots")
        assert time.monotonic() - started < 10
