"""How a consumer talks to the reader service: the dispatcher channel, worker clients, credentials, deadlines.

Dispatcher calls carry a deadline and are retried while the dispatcher is
unreachable (a restart with ``--work_dir`` resumes the job); what the
dispatcher refuses becomes a ``UsageError`` saying why.
"""

from __future__ import annotations

import time

import grpc
import pyarrow.flight as flight

from reader.service import transport
from reader.service.auth import bearer
from reader.service.dispatch_state import PROCESSING_MODES
from schemas.errors import ServiceUnavailableError, SnapfeedError, UsageError

RPC_TIMEOUT_SECONDS = 30.0
#: How long a consumer keeps retrying an unreachable dispatcher (a restart with --work_dir resumes the job).
DISPATCHER_RETRY_SECONDS = 60.0


class ServiceConnection:
    """Where the service is and how to talk to it: the dispatcher channel, worker clients, credentials."""

    def __init__(
        self,
        service: str,
        processing_mode: str,
        job_name: str | None,
        *,
        auth_token: str | None = None,
        tls_ca: str | None = None,
    ) -> None:
        if processing_mode not in PROCESSING_MODES:
            raise UsageError(f"processing_mode={processing_mode!r}; choose one of {', '.join(PROCESSING_MODES)}")
        if not service.startswith("grpc://"):
            raise UsageError(f"service={service!r}; give the dispatcher as grpc://host:port")
        self.address = service.removeprefix("grpc://")
        self.mode = processing_mode
        self.job_name = job_name
        self.metadata = bearer(auth_token)
        self.tls_ca = transport.read_ca(tls_ca, "service_tls_ca")
        headers = [(k.encode(), v.encode()) for k, v in self.metadata]
        #: A split fetch is short: a deadline on the whole call.
        self.flight_options = flight.FlightCallOptions(headers=headers, timeout=RPC_TIMEOUT_SECONDS)
        #: A parallel_epochs stream lasts the epoch at the consumer's pace: Flight's timeout would be a
        #: deadline on the whole stream, so none.
        self.stream_options = flight.FlightCallOptions(headers=headers)

    def channel(self) -> grpc.Channel:
        return transport.dispatcher_channel(self.address, self.tls_ca)

    def flight_client(self, worker: str) -> flight.FlightClient:
        return transport.flight_client(worker, self.tls_ca)

    def call(self, method, request):
        """A dispatcher call with a deadline, retried while the dispatcher is unreachable (restarting)."""
        deadline = time.monotonic() + DISPATCHER_RETRY_SECONDS
        while True:
            try:
                return method(request, timeout=RPC_TIMEOUT_SECONDS, metadata=self.metadata)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise _rpc_error(exc, self.address) from exc
                time.sleep(0.2)


def _rpc_error(exc: grpc.RpcError, address: str) -> SnapfeedError:
    code = exc.code() if hasattr(exc, "code") else None
    if code == grpc.StatusCode.UNAVAILABLE:
        return ServiceUnavailableError(f"the dispatcher at grpc://{address} is unreachable: {exc.details()}")
    if code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNAUTHENTICATED,
    ):
        return UsageError(f"the dispatcher at grpc://{address} refused: {exc.details()}")
    return SnapfeedError(f"the dispatcher at grpc://{address} failed: {code} {exc.details() if code else exc}")
