"""A consumer process's lease heartbeat: one thread per connection renewing the leases of its consumers.

A distributed_epoch consumer holds leases on the splits it reads; the
dispatcher gives a split whose lease lapsed to another consumer. Each
consumer registers while it reads an epoch (``Renewer.keep``, released with
``Renewal.release``); one thread renews them all (``LeaseClient`` in
``leases`` registers its consumer).
"""

from __future__ import annotations

import logging
import math
import threading
import time

import grpc

from reader.service.failure_log import FailureLog
from reader.service.rpc import described
from schemas.service_pb2 import LeaseRequest

log = logging.getLogger(__name__)


class Renewer:
    """Renews the leases of every consumer reading through one connection: their heartbeat, one thread for all.

    Each consumer's leases are renewed a few times per lease term from when it
    registered (``keep``) until it lets go (``Renewal.release``). A failed
    renewal is retried at the next turn; each new reason is logged once per
    consumer (``FailureLog``): leases not renewed within their term go to other
    consumers, and the rows this consumer delivered of them are delivered
    again. The thread lives as long as the connection's channel (``stop``), so
    an epoch does not start one, which delayed each epoch's first batch (docs/architecture.md §9.6).
    """

    def __init__(self, stub, metadata, address: str) -> None:
        self._stub = stub
        self._metadata = metadata
        self._address = address
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._kept: dict[int, Renewal] = {}
        self._thread: threading.Thread | None = None
        #: When the thread's current wait ends (inf: when woken). A consumer due later does not wake it:
        #: every epoch registers one, and a wake-up cost its first batch a thread switch.
        self._sleeps_until = math.inf

    def keep(self, job_id: int, consumer: str, lease_seconds: float) -> Renewal:
        """Renews ``consumer``'s leases in job ``job_id`` every quarter term, from now until released."""
        every = max(0.1, lease_seconds / 4)
        failures = FailureLog(
            log,
            f"consumer {consumer} cannot renew its leases with the dispatcher at grpc://{self._address} "
            f"(retrying every {every:.1f} s; leases lapse after {lease_seconds:.0f} s)",
        )
        renewal = Renewal(self, LeaseRequest(job_id=job_id, consumer=consumer), every, failures)
        with self._lock:
            self._kept[id(renewal)] = renewal
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="snapfeed-renew", daemon=True)
                self._thread.start()
            wake = renewal.next_due < self._sleeps_until
        if wake:
            self._wake.set()
        return renewal

    def _release(self, renewal: Renewal) -> None:
        with self._lock:
            self._kept.pop(id(renewal), None)

    def stop(self) -> None:
        """Stops renewing and returns once the thread is done with the channel (the caller closes it next)."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():  # the GC may finalize on any thread
            thread.join()

    def _due(self) -> tuple[list[Renewal], float | None] | None:
        """The renewals due now (their next turn scheduled) and the seconds until the next one (None: none
        kept); None once stopped."""
        now = time.monotonic()
        with self._lock:
            if self._stopped:
                return None
            due = [renewal for renewal in self._kept.values() if renewal.next_due <= now]
            for renewal in due:
                renewal.next_due = now + renewal.every
            upcoming = min((renewal.next_due for renewal in self._kept.values()), default=None)
            self._sleeps_until = math.inf if upcoming is None else upcoming
        return due, None if upcoming is None else max(0.0, upcoming - now)

    def _run(self) -> None:
        while (turn := self._due()) is not None:
            due, wait = turn
            for renewal in due:
                try:
                    self._stub.Renew(renewal.request, timeout=renewal.every, metadata=self._metadata)
                    renewal.failures.succeeded()
                except grpc.RpcError as exc:
                    renewal.failures.failed(described(exc))
            self._wake.wait(wait)
            self._wake.clear()


class Renewal:
    """One consumer's leases kept alive by the connection's ``Renewer`` until ``release()``."""

    def __init__(self, renewer: Renewer, request: LeaseRequest, every: float, failures: FailureLog) -> None:
        self._renewer = renewer
        self.request = request
        self.every = every
        self.failures = failures
        self.next_due = time.monotonic() + every

    def release(self) -> None:
        self._renewer._release(self)
