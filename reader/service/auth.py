"""Shared-token authentication for the reader service (``--auth_token_file``).

Every snapfeed RPC (dispatcher gRPC calls and worker Flight streams) must carry
``authorization: Bearer <token>``; without it the call fails UNAUTHENTICATED.
The standard gRPC health service stays open so orchestrators can probe.
"""

from __future__ import annotations

import hmac

import grpc
import pyarrow.flight as flight

from reader.service import rpc
from schemas.errors import UsageError

HEADER = "authorization"


def read_token_file(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path) as handle:
            token = handle.read().strip()
    except OSError as exc:
        raise UsageError(f"--auth_token_file={path}: cannot read it ({exc})") from exc
    if not token:
        raise UsageError(f"--auth_token_file={path} is empty")
    return token


def bearer(token: str | None) -> list[tuple[str, str]]:
    return [(HEADER, f"Bearer {token}")] if token else []


def _valid(presented: str | None, token: str) -> bool:
    return presented is not None and hmac.compare_digest(presented, f"Bearer {token}")


class TokenInterceptor(grpc.ServerInterceptor):
    """Rejects dispatcher calls without the token (health checks excepted)."""

    def __init__(self, token: str) -> None:
        self._token = token

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong auth token (see --auth_token_file)")

        self._deny = grpc.unary_unary_rpc_method_handler(deny)

    def intercept_service(self, continuation, handler_call_details):
        if not handler_call_details.method.startswith(f"/{rpc.SERVICE}/"):
            return continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        return continuation(handler_call_details) if _valid(metadata.get(HEADER), self._token) else self._deny


class _TokenMiddleware(flight.ServerMiddleware):
    pass


class FlightTokenMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Rejects worker streams without the token."""

    def __init__(self, token: str) -> None:
        self._token = token

    def start_call(self, info, headers):
        values = headers.get(HEADER) or headers.get(HEADER.title()) or []
        if not _valid(values[0] if values else None, self._token):
            raise flight.FlightUnauthenticatedError("missing or wrong auth token (see --auth_token_file)")
        return _TokenMiddleware()
