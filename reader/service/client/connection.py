"""How a consumer talks to the reader service: the dispatcher channel, worker clients, credentials, deadlines.

Dispatcher calls carry a deadline and are retried while the dispatcher is
unreachable (a restart with ``--work_dir`` resumes the job), logging a warning
while they wait: for ``ServiceOptions.timeout_seconds`` once this consumer has reached
the dispatcher, and at most ``FIRST_CONTACT_SECONDS`` before it ever did (a
wrong address fails fast). What the dispatcher refuses becomes a
``UsageError`` saying why.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

import grpc
import pyarrow as pa
import pyarrow.flight as flight

from reader.core import reaper
from reader.service import transport
from reader.service.auth import bearer
from reader.service.client.renewer import Renewer
from reader.service.options import ServiceOptions
from reader.service.protocol import DISPATCHER_ACTION, ReplacedRunError
from reader.service.rpc import DispatcherStub
from schemas.errors import ServiceUnavailableError, SnapfeedError, UsageError

log = logging.getLogger(__name__)

RPC_TIMEOUT_SECONDS = 30.0
#: How long a consumer that never reached the dispatcher keeps trying (at most ``ServiceOptions.timeout_seconds``).
FIRST_CONTACT_SECONDS = 5.0
#: How often a consumer still retrying logs it again.
RETRY_LOG_SECONDS = 10.0
RETRY_PAUSE_SECONDS = 0.2
#: Threads a connection keeps for dispatcher calls sent ahead (``call_ahead``): one per iterator starting an epoch at once.
CALLS_AHEAD = 4
#: A dispatcher gone (UNAVAILABLE) or stopping with the call in flight (CANCELLED: this client cancels none), or
#: one asking to be asked again (ABORTED: a restore waits for the job's consumers to renew or be presumed gone).
#: Every dispatcher call is idempotent (leases are asked by assignment index), so retrying is safe.
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED)
#: How long a consumer asks what answers at an address that is not a dispatcher.
IDENTIFY_SECONDS = 2.0


class Outage:
    """One stretch of retrying an unreachable part of the service: logs while it lasts, gives up after a limit.

    ``how``: what the logs call it ("unreachable", or "waiting" for a dispatcher that asked to be asked again).
    """

    def __init__(self, what: str, limit_seconds: float, how: str = "unreachable") -> None:
        self._what = what
        self._how = how
        self._limit = limit_seconds
        self._start = time.monotonic()
        self._next_log = self._start

    def retry_or_raise(self, problem: str, advice: str) -> None:
        """Waits a moment before the next try, or raises ``ServiceUnavailableError`` once the limit has passed."""
        now = time.monotonic()
        waited = now - self._start
        if waited >= self._limit:
            raise ServiceUnavailableError(
                f"{self._what}: {self._how} for {waited:.0f} s ({problem}). {advice} "
                f"(ServiceOptions(timeout_seconds=...) sets how long a consumer waits)"
            )
        if now >= self._next_log:
            log.warning(
                "%s: %s (%s); retrying for %.0f s more (ServiceOptions.timeout_seconds)",
                self._what,
                self._how,
                problem,
                self._limit - waited,
            )
            self._next_log = now + RETRY_LOG_SECONDS
        time.sleep(RETRY_PAUSE_SECONDS)


class ServiceConnection:
    """Where the service is and how to talk to it: the dispatcher channel, worker clients, credentials."""

    def __init__(self, options: ServiceOptions) -> None:
        self.options = options
        self.address = options.address.removeprefix("grpc://")
        self.mode = options.processing_mode
        self.job_name = options.job_name
        self.timeout_seconds = float(options.timeout_seconds)
        self._reached = False
        self.metadata = bearer(options.auth_token)
        self.tls_ca = transport.read_ca(options.tls_ca, "tls_ca")
        self._headers = headers = [(k.encode(), v.encode()) for k, v in self.metadata]
        #: A split fetch is short: a deadline on the whole call.
        self.flight_options = flight.FlightCallOptions(headers=headers, timeout=RPC_TIMEOUT_SECONDS)
        #: A parallel_epochs stream lasts the epoch at the consumer's pace: Flight's timeout would be a
        #: deadline on the whole stream, so none.
        self.stream_options = flight.FlightCallOptions(headers=headers)
        self._dispatcher: DispatcherStub | None = None
        self._renewer = None
        self._ahead: concurrent.futures.ThreadPoolExecutor | None = None
        self._dispatcher_lock = threading.Lock()

    def channel(self) -> grpc.Channel:
        return transport.dispatcher_channel(self.address, self.tls_ca)

    def dispatcher(self) -> DispatcherStub:
        """The dispatcher through this connection's one channel: opened on first use, closed with the connection.

        Every epoch of every iterator sharing the connection calls through it:
        an epoch used to open its own channel and paid for connecting it
        before its first call (docs/architecture.md §9.6). gRPC channels are thread-safe.
        """
        with self._dispatcher_lock:
            if self._dispatcher is None:
                channel = self.channel()
                self._dispatcher = DispatcherStub(channel)
                self._renewer = Renewer(self._dispatcher, self.metadata, self.address)
                self._ahead = concurrent.futures.ThreadPoolExecutor(CALLS_AHEAD, "snapfeed-dispatcher-call")
                reaper.on_collect(self, _close, self._renewer, self._ahead, channel)  # not in the GC: it joins
            return self._dispatcher

    def renewer(self) -> Renewer:
        """The one thread renewing the leases of this connection's consumers; it stops with the channel."""
        self.dispatcher()
        return self._renewer

    def call_ahead(self, method, request) -> concurrent.futures.Future:
        """``call`` on one of the connection's threads: the reply (or the error ``call`` raises) as a future.

        For a call whose reply is needed only after other work is done: the
        job request of a warm epoch is sent before the split it expects to
        lease is opened, and the dispatcher answers while the worker gathers
        (``epoch_reads.epoch_batches``). The threads outlive epochs: a gRPC
        future starts a polling thread of its own, a good part of the round
        trip it would overlap (§9.6).
        """
        self.dispatcher()
        return self._ahead.submit(self.call, method, request)

    def flight_client(self, worker: str) -> flight.FlightClient:
        return transport.flight_client(worker, self.tls_ca)

    def outage(self, what: str) -> Outage:
        """An outage of ``what`` starting now, given up after ``timeout_seconds``."""
        return Outage(what, self.timeout_seconds)

    def call(self, method, request):
        """A dispatcher call with a deadline, retried while the dispatcher is unreachable (restarting)."""
        outage = None
        while True:
            try:
                reply = method(request, timeout=RPC_TIMEOUT_SECONDS, metadata=self.metadata)
                self._reached = True
                return reply
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise UsageError(self._not_a_dispatcher(exc.details())) from exc
                if exc.code() not in RETRIED:
                    raise _rpc_error(exc, self.address) from exc
                waiting = exc.code() == grpc.StatusCode.ABORTED
                self._reached = self._reached or waiting  # it answered
                if outage is None:
                    limit = self.timeout_seconds if self._reached else min(self.timeout_seconds, FIRST_CONTACT_SECONDS)
                    how = "waiting" if waiting else "unreachable"
                    outage = Outage(f"the dispatcher at grpc://{self.address}", limit, how)
                advice = "Is it running?" if self._reached else "Check the address and that it is running."
                if waiting:
                    advice = "A restore waits for the consumers of the job it restores to be gone (--lease_seconds)."
                outage.retry_or_raise(exc.details(), advice)

    def _not_a_dispatcher(self, details: str) -> str:
        """What answers at ``service=`` instead of a dispatcher, and the address to give: a snapfeed worker's data
        port names its dispatcher (``protocol.DISPATCHER_ACTION``); anything else gets the general advice."""
        said = f"service=grpc://{self.address} is not a snapfeed dispatcher (UNIMPLEMENTED {details or 'dispatcher calls'})"
        client = None
        try:
            client = self.flight_client(f"grpc://{self.address}")
            options = flight.FlightCallOptions(headers=self._headers, timeout=IDENTIFY_SECONDS)
            reply = next(iter(client.do_action(flight.Action(DISPATCHER_ACTION, b""), options)))
            dispatcher = reply.body.to_pybytes().decode()
            return f"{said}: it is a snapfeed worker's port; give its dispatcher, service='grpc://{dispatcher}'"
        except (pa.ArrowException, StopIteration, OSError, UnicodeDecodeError):  # not a worker, or not answering
            return f"{said}: give the address the dispatcher printed (serving on grpc://HOST:PORT), not a worker's"
        finally:
            if client is not None:
                client.close()


def _close(renewer: Renewer, ahead: concurrent.futures.ThreadPoolExecutor, channel: grpc.Channel) -> None:
    renewer.stop()
    ahead.shutdown(wait=False, cancel_futures=True)
    channel.close()


def _rpc_error(exc: grpc.RpcError, address: str) -> SnapfeedError:
    code = exc.code() if hasattr(exc, "code") else None
    if code == grpc.StatusCode.NOT_FOUND:
        return ReplacedRunError(exc.details())
    if code in (
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNAUTHENTICATED,
    ):
        return UsageError(f"the dispatcher at grpc://{address} refused: {exc.details()}")
    return SnapfeedError(f"the dispatcher at grpc://{address} failed: {code} {exc.details() if code else exc}")
