"""What the reader service's servers are started with: ``DispatcherConfig``, ``WorkerConfig`` and the
``ServerSecurity`` both share, as tf.data service's ``DispatcherConfig``/``WorkerConfig``.

Plain frozen data, checked on construction (one ``UsageError`` line for a bad
value) before any port is bound. ``python -m reader.service`` builds each from
its flags, which are named as the fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from reader.core.options import CacheOptions
from reader.service.dispatch_state import DEFAULT_LEASE_SECONDS
from schemas.errors import UsageError

#: How long a stopping worker waits for the streams in flight by default.
DRAIN_SECONDS = 30.0


def _port(name: str, value: int | None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise UsageError(f"{name}={value!r} (--{name}); give a port number, 0 for any free one")


def _roots(value: str | Sequence[str]) -> tuple[str, ...]:
    """``allowed_roots`` as a tuple (a string is one root, or several separated by commas, as the flag takes)."""
    if isinstance(value, str):
        return tuple(root for root in value.split(",") if root)
    return tuple(value)


def expect(config: object, kind: type, server: str):
    """``config`` when it is a ``kind``; anything else (a port, as servers once took) is one line naming what to give."""
    if not isinstance(config, kind):
        raise UsageError(f"{server}({config!r}); give a reader.service.{kind.__name__}(...)")
    return config


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerSecurity:
    """The token and TLS files a server requires and serves with; the dispatcher and every worker take the same.

    Args:
        auth_token: every dispatcher RPC and worker stream must carry this bearer token (None: no token).
        tls_cert: a PEM certificate (chain): the server speaks TLS only (with ``tls_key``).
        tls_key: the PEM private key of ``tls_cert``, unencrypted.
    """

    auth_token: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def __post_init__(self) -> None:
        if self.auth_token is not None and (not isinstance(self.auth_token, str) or not self.auth_token):
            raise UsageError("auth_token= is empty; give the shared token, or None for no token")
        if bool(self.tls_cert) != bool(self.tls_key):
            given, missing = ("tls_cert", "tls_key") if self.tls_cert else ("tls_key", "tls_cert")
            raise UsageError(
                f"{given} (--{given}) needs {missing} (--{missing}) too: a certificate and its private key"
            )

    def tls(self):
        """The certificate and key as served (``transport.ServerTls``), checked to match; None for plaintext."""
        from reader.service import transport

        return transport.ServerTls.load(self.tls_cert, self.tls_key)


@dataclasses.dataclass(frozen=True, kw_only=True)
class DispatcherConfig:
    """What a dispatcher is started with (``reader.service.DispatchServer``).

    Args:
        port: the port to serve on (0: any free one; ``.target`` says which).
        host: the address to listen on (``0.0.0.0`` for all).
        work_dir: journal jobs, acks and leases here, so a restarted dispatcher resumes them (None: no journal).
        allowed_roots: snapshot roots consumers may name: local folders or URI prefixes (empty: any snapshot).
        lease_seconds: how long a consumer's lease on a split lasts unrenewed before another may take it.
        max_workers: threads answering RPCs.
        max_message_bytes: the largest gRPC message sent or received.
        metrics_port: serve Prometheus metrics over HTTP on this port (0: any free one; None: off).
        security: the token and TLS files (``ServerSecurity``).
    """

    port: int = 0
    host: str = "127.0.0.1"
    work_dir: str | None = None
    allowed_roots: Sequence[str] = ()
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    max_workers: int = 32
    max_message_bytes: int = 4 << 20
    metrics_port: int | None = None
    security: ServerSecurity = ServerSecurity()

    def __post_init__(self) -> None:
        _port("port", self.port)
        _port("metrics_port", self.metrics_port, optional=True)
        object.__setattr__(self, "allowed_roots", _roots(self.allowed_roots))
        lease = self.lease_seconds
        if isinstance(lease, bool) or not isinstance(lease, int | float) or not lease > 0:
            raise UsageError(f"lease_seconds={lease!r} (--lease_seconds); give a positive number of seconds")
        for name in ("max_workers", "max_message_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError(f"{name}={value!r}; give a positive integer")
        if not isinstance(self.security, ServerSecurity):
            raise UsageError(f"security={self.security!r}; give a reader.service.ServerSecurity(...)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """What a worker is started with (``reader.service.WorkerServer``).

    Args:
        dispatcher_address: the dispatcher it registers with, ``host:port`` or ``grpc://host:port``.
        port: the Flight port to stream on (0: any free one; ``.target`` says which).
        host: the address to listen on, and the one the worker tells the dispatcher consumers reach it at.
        allowed_roots: snapshot roots this worker reads from (empty: any snapshot).
        health_port: the gRPC health checking port (0: any free one).
        drain_seconds: on ``stop()``, how long to wait for the streams in flight before leaving them.
        metrics_port: serve Prometheus metrics over HTTP on this port (0: any free one; None: off).
        cache: a local cache of bucket shards shared with the host's readers (``reader.CacheOptions``).
        security: the token and TLS files (``ServerSecurity``); the token is also sent to the dispatcher.
        dispatcher_tls_ca: a PEM file, the CA that signed a TLS dispatcher's certificate.
    """

    dispatcher_address: str
    port: int = 0
    host: str = "127.0.0.1"
    allowed_roots: Sequence[str] = ()
    health_port: int = 0
    drain_seconds: float = DRAIN_SECONDS
    metrics_port: int | None = None
    cache: CacheOptions = CacheOptions()
    security: ServerSecurity = ServerSecurity()
    dispatcher_tls_ca: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.dispatcher_address, str) or not self.dispatcher_address.removeprefix("grpc://"):
            raise UsageError(f"dispatcher_address={self.dispatcher_address!r}; give the dispatcher's host:port")
        _port("port", self.port)
        _port("health_port", self.health_port)
        _port("metrics_port", self.metrics_port, optional=True)
        object.__setattr__(self, "allowed_roots", _roots(self.allowed_roots))
        drain = self.drain_seconds
        if isinstance(drain, bool) or not isinstance(drain, int | float) or not drain >= 0:
            raise UsageError(f"drain_seconds={drain!r} (--drain_seconds); give a number of seconds, 0 or more")
        if not isinstance(self.cache, CacheOptions):
            raise UsageError(f"cache={self.cache!r}; give a reader.CacheOptions(...)")
        if not isinstance(self.security, ServerSecurity):
            raise UsageError(f"security={self.security!r}; give a reader.service.ServerSecurity(...)")
