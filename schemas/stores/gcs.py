"""Google Cloud Storage: pyarrow for reads, google-cloud-storage for listings, commits and errors.

A reader opening a ``gs://`` snapshot checks the bucket, looks for the
snapshot's folder and markers and reads its metadata: pyarrow's filesystem,
which it streams shards with anyway, answers all four. Importing
google-cloud-storage and making its client took most of a first batch's
opening (docs/architecture.md §9.7), so it is imported only where pyarrow cannot answer: listings (pyarrow's non-recursive
GCS listing misses folders that exist only as key prefixes, apache/arrow#35993),
writes and deletes, reads that need the object's generation, and any read
pyarrow failed. The failed read is then made again by google-cloud-storage,
whose exceptions say what is wrong (missing bucket, no permission, endpoint out
of reach) in the one line ``_errors`` writes.

Commits use generation preconditions: ``ifGenerationMatch=0`` creates only if
absent, ``ifGenerationMatch=<generation read>`` replaces only what was compared.
google-cloud-storage retries these on transient errors; a retry whose first
attempt did succeed gets 412, which ``ObjectStore`` reports as False and the
commit protocol resolves by re-reading the marker.

Configuration is Google's own: credentials from GOOGLE_APPLICATION_CREDENTIALS,
``gcloud auth application-default login`` or the metadata server; an emulator
from STORAGE_EMULATOR_HOST (or CLOUD_STORAGE_EMULATOR_ENDPOINT), which both
clients then reach without credentials.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import urllib.parse

from schemas.errors import StorageError
from schemas.stores.object_store import Listing, ObjectInfo, ObjectStore

#: How long a request may be retried on transient errors before the operation fails.
RETRY_SECONDS = 60.0
#: The first request to a bucket is not retried and must answer within this: a wrong endpoint fails in seconds.
CHECK_TIMEOUT_SECONDS = 5.0
#: pyarrow's answers to lookups and metadata reads (a bucket's check, a folder, an object's size or bytes) are
#: retried for at most this long before google-cloud-storage asks again, with its own retries, and names what is
#: wrong (pyarrow's client cannot be told not to retry). Retrying both for ``RETRY_SECONDS`` kept a reader
#: whose store stopped answering waiting twice as long for its error line. Shards stream through a pyarrow
#: filesystem that retries for ``RETRY_SECONDS``: there, nothing asks again.
QUICK_RETRY_SECONDS = 1.0
_CREDENTIALS_HELP = (
    "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run "
    "`gcloud auth application-default login` (on GCE, GKE and Dataflow the metadata server provides them)"
)


def emulator_endpoint() -> str:
    return os.environ.get("STORAGE_EMULATOR_HOST") or os.environ.get("CLOUD_STORAGE_EMULATOR_ENDPOINT") or ""


def _credentials_problem() -> str:
    """Why no Google credentials can be found ("" when they can), decided in seconds."""
    if emulator_endpoint():
        return ""
    import google.auth
    import google.auth.exceptions

    try:
        google.auth.default()
    except google.auth.exceptions.DefaultCredentialsError as exc:
        key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        return f"GOOGLE_APPLICATION_CREDENTIALS={key_file}: {str(exc).splitlines()[0]}" if key_file else "none found"
    return ""


class GcsStore(ObjectStore):
    scheme = "gs"
    name = "gs://"
    _credentials_found = False  # once per store: google.auth may ask the metadata server
    _quick_filesystem_instance = None

    def _require_credentials(self) -> None:
        """Fails at once naming what to set, where pyarrow and google-cloud-storage would retry for minutes."""
        if not self._credentials_found:
            problem = _credentials_problem()
            if problem:
                raise StorageError(f"no Google Cloud credentials ({problem}): {_CREDENTIALS_HELP}.")
            self._credentials_found = True

    def _client(self):
        if self._client_instance is None:
            self._require_credentials()
            from google.cloud import storage

            self._client_instance = storage.Client()
        return self._client_instance

    def _arrow_filesystem(self, retry_seconds: float):
        """pyarrow's GCS filesystem at the emulator or Google, retrying transient errors for ``retry_seconds``."""
        import pyarrow.fs as pafs

        limit = datetime.timedelta(seconds=retry_seconds)
        endpoint = emulator_endpoint()
        if endpoint:
            url = urllib.parse.urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
            return pafs.GcsFileSystem(
                anonymous=True, scheme=url.scheme, endpoint_override=url.netloc, retry_time_limit=limit
            )
        self._require_credentials()
        return pafs.GcsFileSystem(retry_time_limit=limit)

    def _filesystem(self):
        if self._filesystem_instance is None:
            self._filesystem_instance = self._arrow_filesystem(RETRY_SECONDS)
        return self._filesystem_instance

    def _quick_filesystem(self):
        """pyarrow's filesystem for lookups and metadata reads, which google-cloud-storage makes again where
        it fails (``QUICK_RETRY_SECONDS``)."""
        if self._quick_filesystem_instance is None:
            self._quick_filesystem_instance = self._arrow_filesystem(QUICK_RETRY_SECONDS)
        return self._quick_filesystem_instance

    def _arrow_info(self, path: str):
        """pyarrow's ``FileInfo`` for ``bucket/key``; None where pyarrow failed (the caller asks google-cloud-storage)."""
        try:
            return self._quick_filesystem().get_file_info(path)
        except OSError:
            return None

    @staticmethod
    def _retry():
        from google.cloud.storage.retry import DEFAULT_RETRY

        return DEFAULT_RETRY.with_timeout(RETRY_SECONDS)

    @contextlib.contextmanager
    def _errors(self, bucket: str, key: str = ""):
        """Google's exceptions as one StorageError line naming the object and what to do."""
        import requests
        from google.api_core import exceptions as gexc

        where = f"gs://{bucket}/{key}".rstrip("/")
        try:
            yield
        except gexc.NotFound as exc:  # a missing object is None or suppressed by the caller: here, the bucket
            raise StorageError(f"bucket gs://{bucket} does not exist ({where}): create it or fix the path.") from exc
        except (gexc.Forbidden, gexc.Unauthorized) as exc:
            raise StorageError(
                f"no permission for {where} ({exc.code} {exc.message.splitlines()[0][:200]}): grant the account "
                f"storage object access on gs://{bucket}, or {_CREDENTIALS_HELP}."
            ) from exc
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout, gexc.RetryError) as exc:
            endpoint = emulator_endpoint() or "storage.googleapis.com"
            raise StorageError(
                f"cannot reach Google Cloud Storage at {endpoint} for {where}: check the network"
                f"{' and STORAGE_EMULATOR_HOST' if emulator_endpoint() else ''}."
            ) from exc

    def _check_bucket(self, bucket: str, key: str) -> None:
        import pyarrow.fs as pafs

        info = self._arrow_info(bucket)
        if info is not None and info.type == pafs.FileType.Directory:
            return
        with self._errors(bucket, key):  # a missing bucket, or pyarrow failed: let Google's client say why
            list(self._client().list_blobs(bucket, max_results=1, retry=None, timeout=CHECK_TIMEOUT_SECONDS))

    def _has_children(self, bucket: str, key: str) -> bool:
        import pyarrow.fs as pafs

        info = self._arrow_info(f"{bucket}/{key}")
        if info is not None and info.type in (pafs.FileType.Directory, pafs.FileType.NotFound):
            return info.type == pafs.FileType.Directory
        return super()._has_children(bucket, key)  # failed, or an object named like the folder hides it

    def _list(self, bucket: str, prefix: str, *, recursive: bool) -> Listing:
        with self._errors(bucket, prefix):
            pages = self._client().list_blobs(
                bucket, prefix=prefix or None, delimiter=None if recursive else "/", retry=self._retry()
            )
            objects = [
                ObjectInfo(blob.name, blob.size or 0, blob.updated.timestamp() if blob.updated else 0.0)
                for blob in pages
            ]
            return Listing(objects, sorted(pages.prefixes))

    def _head(self, bucket: str, key: str) -> ObjectInfo | None:
        import pyarrow.fs as pafs

        info = self._arrow_info(f"{bucket}/{key}")
        if info is not None:
            if info.type != pafs.FileType.File:
                return None  # missing, or only a folder
            return ObjectInfo(key, info.size or 0, info.mtime.timestamp() if info.mtime else 0.0)
        with self._errors(bucket, key):
            blob = self._client().bucket(bucket).get_blob(key, retry=self._retry())
        if blob is None:
            return None
        return ObjectInfo(blob.name, blob.size or 0, blob.updated.timestamp() if blob.updated else 0.0)

    def _read(self, bucket: str, key: str) -> bytes | None:
        try:
            with self._quick_filesystem().open_input_stream(f"{bucket}/{key}") as stream:
                return stream.readall()
        except FileNotFoundError:
            return None
        except OSError:
            return super()._read(bucket, key)

    def _get(self, bucket: str, key: str) -> tuple[bytes, object] | None:
        from google.api_core import exceptions as gexc

        with self._errors(bucket, key):
            while True:  # the object may change between the metadata read and the download: read both again
                blob = self._client().bucket(bucket).get_blob(key, retry=self._retry())
                if blob is None:
                    return None
                try:
                    data = blob.download_as_bytes(if_generation_match=blob.generation, retry=self._retry())
                except (gexc.PreconditionFailed, gexc.NotFound):
                    continue
                return data, blob.generation

    def _put(self, bucket: str, key: str, data: bytes, *, if_absent: bool = False, if_version: object = None) -> bool:
        from google.api_core import exceptions as gexc

        precondition = 0 if if_absent else if_version
        with self._errors(bucket, key):
            blob = self._client().bucket(bucket).blob(key)
            try:
                blob.upload_from_string(data, if_generation_match=precondition, retry=self._retry())
            except gexc.PreconditionFailed:
                return False
        return True

    def _delete(self, bucket: str, key: str) -> None:
        from google.api_core import exceptions as gexc

        with self._errors(bucket, key), contextlib.suppress(gexc.NotFound):
            self._client().bucket(bucket).blob(key).delete(retry=self._retry())
