"""Amazon S3 (and S3-compatible stores): boto3 for metadata and commits, pyarrow for streaming shards.

Commits use S3's conditional writes: ``If-None-Match: *`` creates only if
absent, ``If-Match: <ETag>`` replaces only what was compared. boto3 retries
them on transient errors; a retry whose first attempt did succeed gets 412,
which ``ObjectStore`` reports as False and the commit protocol resolves by
re-reading the marker. A 409 (a concurrent conditional write in flight) is
retried here.

Configuration is AWS's own: credentials from AWS_ACCESS_KEY_ID /
AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws, or the instance's role; a
non-AWS endpoint (MinIO, an emulator) from AWS_ENDPOINT_URL_S3 or
AWS_ENDPOINT_URL, which both clients are given.
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.parse

from schemas.errors import StorageError
from schemas.stores.object_store import Listing, ObjectInfo, ObjectStore

#: Attempts per request on transient errors (botocore's "standard" mode backs off between them).
MAX_ATTEMPTS = 5
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 60.0
_CONFLICT_RETRIES = 10
_CREDENTIALS_HELP = "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with ~/.aws/credentials"


def endpoint_url() -> str:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""


class S3Store(ObjectStore):
    scheme = "s3"
    name = "s3://"

    def _session(self):
        import boto3

        return boto3.session.Session()

    def _client(self):
        if self._client_instance is None:
            from botocore.config import Config

            session = self._session()
            if session.get_credentials() is None:
                raise StorageError(f"no AWS credentials found: {_CREDENTIALS_HELP}.")
            config = Config(
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                read_timeout=READ_TIMEOUT_SECONDS,
                retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
            )
            self._client_instance = session.client("s3", endpoint_url=endpoint_url() or None, config=config)
        return self._client_instance

    def _filesystem(self):
        if self._filesystem_instance is None:
            import pyarrow.fs as pafs

            client = self._client()  # fails fast, naming the missing credentials
            options = {
                "region": client.meta.region_name or "us-east-1",
                "connect_timeout": CONNECT_TIMEOUT_SECONDS,
                "request_timeout": READ_TIMEOUT_SECONDS,
                "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=MAX_ATTEMPTS),
            }
            if endpoint_url():
                url = urllib.parse.urlparse(endpoint_url())
                options.update(endpoint_override=url.netloc, scheme=url.scheme or "https")
            self._filesystem_instance = pafs.S3FileSystem(**options)
        return self._filesystem_instance

    @contextlib.contextmanager
    def _errors(self, bucket: str, key: str = ""):
        """botocore's exceptions as one StorageError line naming the object and what to do."""
        from botocore import exceptions as bexc

        where = f"s3://{bucket}/{key}".rstrip("/")
        try:
            yield
        except bexc.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "NoSuchBucket":
                raise StorageError(
                    f"bucket s3://{bucket} does not exist ({where}): create it or fix the path."
                ) from exc
            if code in ("AccessDenied", "Forbidden", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise StorageError(
                    f"no permission for {where} ({code}): grant the credentials s3:ListBucket, s3:GetObject, "
                    f"s3:PutObject and s3:DeleteObject on s3://{bucket}, or {_CREDENTIALS_HELP}."
                ) from exc
            raise
        except (bexc.EndpointConnectionError, bexc.ConnectTimeoutError, bexc.ReadTimeoutError) as exc:
            raise StorageError(
                f"cannot reach S3 at {endpoint_url() or 'the AWS endpoint'} for {where}: check the network"
                f"{' and AWS_ENDPOINT_URL' if endpoint_url() else ''}."
            ) from exc
        except bexc.NoCredentialsError as exc:
            raise StorageError(f"no AWS credentials found for {where}: {_CREDENTIALS_HELP}.") from exc

    def _check_bucket(self, bucket: str, key: str) -> None:
        from botocore.config import Config

        quick = self._client().meta.config.merge(Config(retries={"max_attempts": 1, "mode": "standard"}))
        probe = self._session().client("s3", endpoint_url=endpoint_url() or None, config=quick)
        with self._errors(bucket, key):
            probe.list_objects_v2(Bucket=bucket, MaxKeys=1)

    def _list(self, bucket: str, prefix: str, *, recursive: bool) -> Listing:
        objects, prefixes = [], []
        arguments = {"Bucket": bucket, "Prefix": prefix}
        if not recursive:
            arguments["Delimiter"] = "/"
        with self._errors(bucket, prefix):
            for page in self._client().get_paginator("list_objects_v2").paginate(**arguments):
                objects += [
                    ObjectInfo(item["Key"], item["Size"], item["LastModified"].timestamp())
                    for item in page.get("Contents", [])
                ]
                prefixes += [item["Prefix"] for item in page.get("CommonPrefixes", [])]
        return Listing(objects, sorted(prefixes))

    @staticmethod
    def _status(exc) -> int:
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))

    def _head(self, bucket: str, key: str) -> ObjectInfo | None:
        from botocore import exceptions as bexc

        with self._errors(bucket, key):
            try:
                head = self._client().head_object(Bucket=bucket, Key=key)
            except bexc.ClientError as exc:
                if self._status(exc) == 404:
                    return None
                raise
        return ObjectInfo(key, head["ContentLength"], head["LastModified"].timestamp())

    def _get(self, bucket: str, key: str) -> tuple[bytes, object] | None:
        from botocore import exceptions as bexc

        with self._errors(bucket, key):
            try:
                response = self._client().get_object(Bucket=bucket, Key=key)
            except bexc.ClientError as exc:
                if exc.response.get("Error", {}).get("Code") == "NoSuchKey":
                    return None
                raise
            return response["Body"].read(), response["ETag"]

    def _put(self, bucket: str, key: str, data: bytes, *, if_absent: bool = False, if_version: object = None) -> bool:
        from botocore import exceptions as bexc

        arguments = {"Bucket": bucket, "Key": key, "Body": data}
        if if_absent:
            arguments["IfNoneMatch"] = "*"
        elif if_version is not None:
            arguments["IfMatch"] = if_version
        with self._errors(bucket, key):
            for attempt in range(_CONFLICT_RETRIES):
                try:
                    self._client().put_object(**arguments)
                    return True
                except bexc.ClientError as exc:
                    status = self._status(exc)
                    if status == 412:
                        return False
                    if status != 409 or attempt == _CONFLICT_RETRIES - 1:
                        raise
                    time.sleep(0.05 * (attempt + 1))  # a concurrent conditional write is in flight: it decides
        return False

    def _delete(self, bucket: str, key: str) -> None:
        with self._errors(bucket, key):
            self._client().delete_object(Bucket=bucket, Key=key)  # S3 answers 204 for a missing key too
