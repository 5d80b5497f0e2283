"""The local object stores (testing.object_stores) and the fault proxy (testing.http_proxy) behave as tests rely on.

The emulators start once per session (tests.object_store_fixtures, loaded by tests/conftest.py).
"""

from __future__ import annotations

import http.client
import io
import json
import os
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import pytest

from testing.http_proxy import http_proxy
from tests import helpers


def _table(rows: int) -> pa.Table:
    return pa.table(
        {"id": pa.array(range(rows), pa.int64()), "payload": pa.array([f"row-{i}" * 8 for i in range(rows)])}
    )


def _pyarrow_round_trip(root: str) -> None:
    """Writes, lists and reads an Arrow file under ``root`` (s3://B or gs://B) through FileSystem.from_uri."""
    fs, bucket = pafs.FileSystem.from_uri(root)
    table = _table(20_000)
    with fs.open_output_stream(f"{bucket}/snap/part-0.arrow") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=4096)
    listed = fs.get_file_info(pafs.FileSelector(f"{bucket}/snap"))
    assert [(i.path, i.type) for i in listed] == [(f"{bucket}/snap/part-0.arrow", pafs.FileType.File)]
    with fs.open_input_file(f"{bucket}/snap/part-0.arrow") as source:  # random access: range GETs
        assert ipc.open_file(source).read_all().equals(table)
    fs.delete_file(f"{bucket}/snap/part-0.arrow")
    assert fs.get_file_info(f"{bucket}/snap/part-0.arrow").type == pafs.FileType.NotFound


# --- S3 --------------------------------------------------------------------------------------------------------


def test_s3_conditional_writes_fail_with_412(s3_emulator, s3_bucket):
    import botocore.exceptions

    bucket = s3_bucket.removeprefix("s3://")
    client = s3_emulator.client()
    stale = client.put_object(Bucket=bucket, Key="manifest", Body=b"v1", IfNoneMatch="*")["ETag"]
    current = client.put_object(Bucket=bucket, Key="manifest", Body=b"v2", IfMatch=stale)["ETag"]
    for condition in ({"IfNoneMatch": "*"}, {"IfMatch": stale}):
        with pytest.raises(botocore.exceptions.ClientError) as failed:
            client.put_object(Bucket=bucket, Key="manifest", Body=b"v3", **condition)
        assert failed.value.response["Error"]["Code"] == "PreconditionFailed"
        assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    client.put_object(Bucket=bucket, Key="manifest", Body=b"v4", IfMatch=current)
    assert client.get_object(Bucket=bucket, Key="manifest")["Body"].read() == b"v4"


def test_s3_pyarrow_round_trip_from_the_env(s3_bucket):
    assert os.environ["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
    _pyarrow_round_trip(s3_bucket)


# --- GCS -------------------------------------------------------------------------------------------------------


def test_gcs_conditional_writes_fail_with_412(gcs_bucket):
    from google.api_core import exceptions
    from google.cloud import storage

    blob = storage.Client().bucket(gcs_bucket.removeprefix("gs://")).blob("manifest")  # from STORAGE_EMULATOR_HOST
    blob.upload_from_string(b"v1", if_generation_match=0)
    stale = blob.generation
    blob.upload_from_string(b"v2", if_generation_match=stale)
    for generation in (0, stale):
        with pytest.raises(exceptions.PreconditionFailed):
            blob.upload_from_string(b"v3", if_generation_match=generation)
    assert blob.download_as_bytes() == b"v2"


def test_gcs_pyarrow_round_trip_from_the_env_without_the_token_server(gcs_emulator, gcs_bucket):
    tokens = gcs_emulator.token_requests
    _pyarrow_round_trip(gcs_bucket)
    assert gcs_emulator.token_requests == tokens  # pyarrow signs its own JWTs with the key


def test_beam_filesystems_reach_both_stores_from_the_env(s3_emulator, gcs_emulator, s3_bucket, gcs_bucket):
    """Beam's s3:// (boto3) and gs:// (google-cloud-storage with the key; the token server) in a fresh process."""
    script = textwrap.dedent(
        """
        import json, sys
        from apache_beam.io.filesystems import FileSystems
        from apache_beam.options.pipeline_options import PipelineOptions

        FileSystems.set_options(PipelineOptions([]))
        sizes = {}
        for root in sys.argv[1:]:
            with FileSystems.create(f"{root}/beam/out.txt") as f:
                f.write(b"written by beam")
            with FileSystems.open(f"{root}/beam/out.txt") as f:
                assert f.read() == b"written by beam"
            sizes[root] = [m.size_in_bytes for m in FileSystems.match([f"{root}/beam/*"])[0].metadata_list]
        print(json.dumps(sizes))
        """
    )
    tokens = gcs_emulator.token_requests
    done = subprocess.run(
        [sys.executable, "-c", script, s3_bucket, gcs_bucket],
        env={**os.environ, **s3_emulator.env, **gcs_emulator.env, "PYTHONPATH": str(helpers.REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {s3_bucket: [15], gcs_bucket: [15]}
    assert gcs_emulator.token_requests > tokens


# --- the proxy -------------------------------------------------------------------------------------------------


def test_proxy_delays_every_request(s3_emulator, s3_bucket):
    bucket = s3_bucket.removeprefix("s3://")
    with http_proxy(s3_emulator.endpoint, delay_s=0.3) as proxy:
        client = s3_emulator.client(proxy.endpoint)
        started = time.monotonic()
        client.put_object(Bucket=bucket, Key="k", Body=b"x")
        client.get_object(Bucket=bucket, Key="k")["Body"].read()
        assert time.monotonic() - started >= 2 * 0.3
        proxy.set_delay(0.5)
        started = time.monotonic()
        client.head_object(Bucket=bucket, Key="k")
        assert time.monotonic() - started >= 0.5
        assert proxy.requests_seen == 3


def test_proxy_streams_range_reads_and_uploads(s3_emulator, gcs_emulator, s3_bucket, gcs_bucket, monkeypatch):
    """pyarrow on both stores through the proxy (its GCS reads hold the GIL: the proxy is another process)."""
    for emulator, root in ((s3_emulator, s3_bucket), (gcs_emulator, gcs_bucket)):
        with http_proxy(emulator.endpoint) as proxy:
            for name, value in emulator.env_via(proxy.endpoint).items():
                monkeypatch.setenv(name, value)
            _pyarrow_round_trip(root)
            assert proxy.requests_seen >= 4


def test_proxy_counts_the_bytes_ranged_reads_ask_for(s3_emulator, gcs_emulator, s3_bucket, gcs_bucket, monkeypatch):
    """What "each byte downloaded once" is measured by: a positioned read of N bytes is N ranged bytes."""
    payload = os.urandom(300_000)
    for emulator, root in ((s3_emulator, s3_bucket), (gcs_emulator, gcs_bucket)):
        with http_proxy(emulator.endpoint) as proxy:
            for name, value in emulator.env_via(proxy.endpoint).items():
                monkeypatch.setenv(name, value)
            fs, bucket = pafs.FileSystem.from_uri(root)
            with fs.open_output_stream(f"{bucket}/ranged") as sink:
                sink.write(payload)
            before = proxy.stats()["ranged_bytes"]
            with fs.open_input_file(f"{bucket}/ranged") as source:
                assert source.read_at(1000, 5000) == payload[5000:6000]
                assert source.read_at(70_000, 200_000) == payload[200_000:270_000]
            assert proxy.stats()["ranged_bytes"] - before == 71_000, root


def test_proxy_sends_gcs_resumable_uploads_through_itself(gcs_emulator, gcs_bucket):
    payload = os.urandom(600_000)
    with http_proxy(gcs_emulator.endpoint) as proxy:
        bucket = gcs_emulator.client(proxy.endpoint).bucket(gcs_bucket.removeprefix("gs://"))
        assert bucket.blob("other").create_resumable_upload_session().startswith(proxy.endpoint + "/")
        blob = bucket.blob("big", chunk_size=256 * 1024)
        blob.upload_from_file(io.BytesIO(payload))  # size unknown: a session (at its Location), then 256 KiB chunks
        by_method = proxy.stats()["requests_by_method"]
        assert (by_method["POST"], by_method["PUT"]) == (2, 3)  # the chunks went through the proxy too
    assert gcs_emulator.client().bucket(gcs_bucket.removeprefix("gs://")).blob("big").download_as_bytes() == payload


def test_lost_s3_response_the_write_applied_and_the_retry_gets_412(s3_emulator, s3_bucket):
    import botocore.exceptions

    bucket = s3_bucket.removeprefix("s3://")
    with http_proxy(s3_emulator.endpoint) as proxy:
        proxy.drop_response(lambda method, target, headers: method == "PUT" and target == f"/{bucket}/once")
        no_retries = s3_emulator.client(proxy.endpoint, retries={"mode": "standard", "total_max_attempts": 1})
        with pytest.raises(botocore.exceptions.ConnectionClosedError):
            no_retries.put_object(Bucket=bucket, Key="once", Body=b"v1", IfNoneMatch="*")
        assert s3_emulator.client().get_object(Bucket=bucket, Key="once")["Body"].read() == b"v1"

        proxy.drop_response(lambda method, target, headers: method == "PUT" and target == f"/{bucket}/retried")
        retrying = s3_emulator.client(proxy.endpoint, retries={"mode": "standard", "total_max_attempts": 3})
        with pytest.raises(botocore.exceptions.ClientError) as failed:
            retrying.put_object(Bucket=bucket, Key="retried", Body=b"v1", IfNoneMatch="*")
        assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        assert proxy.responses_dropped == 2
        assert proxy.dropped == [("PUT", f"/{bucket}/once"), ("PUT", f"/{bucket}/retried")]
        assert proxy.requests_seen == 3
    assert s3_emulator.client().get_object(Bucket=bucket, Key="retried")["Body"].read() == b"v1"


def test_lost_gcs_response_the_write_applied_and_the_retry_gets_412(gcs_emulator, gcs_bucket):
    import requests
    from google.api_core import exceptions

    bucket = gcs_emulator.client().bucket(gcs_bucket.removeprefix("gs://"))
    with http_proxy(gcs_emulator.endpoint) as proxy:
        via_proxy = gcs_emulator.client(proxy.endpoint).bucket(bucket.name)
        uploads = lambda method, target, headers: method == "POST" and target.startswith("/upload/")  # noqa: E731
        proxy.drop_response(uploads)
        with pytest.raises(requests.exceptions.ConnectionError):
            via_proxy.blob("once").upload_from_string(b"v1", if_generation_match=0, retry=None)
        assert bucket.blob("once").download_as_bytes() == b"v1"

        proxy.drop_response(uploads)
        with pytest.raises(exceptions.PreconditionFailed):  # the default retry when if_generation_match is given
            via_proxy.blob("retried").upload_from_string(b"v1", if_generation_match=0)
        stats = proxy.stats()
        assert stats["responses_dropped"] == 2
        assert stats["requests_by_method"]["POST"] == 3  # (google-cloud-storage also GETs the bucket after an error)
    assert bucket.blob("retried").download_as_bytes() == b"v1"


def test_a_predicate_that_raises_fails_the_proxy_block(s3_emulator, s3_bucket):
    with pytest.raises(RuntimeError, match="ZeroDivisionError"), http_proxy(s3_emulator.endpoint) as proxy:
        proxy.drop_response(lambda method, target, headers: 1 / 0)
        s3_emulator.client(proxy.endpoint).head_bucket(Bucket=s3_bucket.removeprefix("s3://"))


def test_proxy_passes_chunked_bodies_both_ways(gcs_emulator, gcs_bucket):
    bucket = gcs_bucket.removeprefix("gs://")
    for i in range(60):
        gcs_emulator.client().bucket(bucket).blob(f"many/{i:03d}-" + "x" * 100).upload_from_string(b"")
    payload = os.urandom(3_000_000)
    with http_proxy(gcs_emulator.endpoint) as proxy:
        connection = http.client.HTTPConnection(*proxy.endpoint.removeprefix("http://").split(":"))
        connection.request(
            "POST",
            f"/upload/storage/v1/b/{bucket}/o?uploadType=media&name=chunky",
            body=iter([payload[:1_000_000], payload[1_000_000:]]),
            encode_chunked=True,
            headers={"Content-Type": "application/octet-stream", "Expect": "100-continue"},
        )
        response = connection.getresponse()
        assert (response.status, json.loads(response.read())["size"]) == (200, str(len(payload)))
        connection.request("GET", f"/storage/v1/b/{bucket}/o?prefix=many/")  # on the same connection
        response = connection.getresponse()
        assert response.getheader("Transfer-Encoding") == "chunked"
        assert len(json.loads(response.read())["items"]) == 60
        connection.close()
        assert proxy.requests_seen == 2
    assert gcs_emulator.client().bucket(bucket).blob("chunky").download_as_bytes() == payload
