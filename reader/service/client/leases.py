"""The dispatcher side of a distributed_epoch consumer: leasing splits, acknowledging them, renewing the leases.

A ``LeaseClient`` owns a small pool for the calls that run in the background
(the next leases while batches are cut, carrying the acks of the splits
delivered since the previous lease; the acks left when the consumer stops
reading) and the consumer's ``Renewal`` (its heartbeat, sent by the
connection's one ``Renewer`` thread). ``close()`` ends both (``epoch_batches``
calls it in a ``with contextlib.closing``); the channel they use is the
connection's and outlives them.
"""

from __future__ import annotations

import concurrent.futures
import logging

from reader.service.client.connection import ServiceConnection
from schemas.errors import UsageError
from schemas.service_pb2 import AckRequest, LeaseRequest

log = logging.getLogger(__name__)


class LeaseClient:
    """One consumer's leases in one job: ``lease``, ``ack``, each also in the background."""

    def __init__(self, connection: ServiceConnection, stub, job, consumer: str) -> None:
        self._call = connection.call
        self._stub = stub
        self._job_id = job.job_id
        self._consumer = consumer
        #: Off the thread that cuts batches: the next leases (with acks) while batches are cut, the last acks.
        self._background = concurrent.futures.ThreadPoolExecutor(2, "snapfeed-lease")
        self._lease_seconds = job.lease_seconds or 30.0
        self._renewal = connection.renewer().keep(job.job_id, consumer, self._lease_seconds)

    def close(self) -> None:
        """Stops renewing and waits for the background calls (an ack in flight is sent)."""
        self._renewal.release()
        self._background.shutdown(wait=True)

    def lease(self, index: int, count: int, acked: list[int] = ()):
        """Assignments ``index`` .. ``index + count - 1`` in one round trip (fewer: none pending for now).

        ``acked``: splits whose rows were all delivered, acknowledged in the
        same round trip (before leasing); any another consumer took over
        meanwhile is logged.
        """
        request = LeaseRequest(job_id=self._job_id, consumer=self._consumer, index=index, count=count, acked=acked)
        reply = self._call(self._stub.LeaseSplit, request)
        for split in reply.ack_refused:
            _delivered_twice(split, "another consumer holds it now")
        return reply

    def lease_later(self, index: int, count: int, acked: list[int] = ()) -> concurrent.futures.Future:
        return self._background.submit(self.lease, index, count, acked)

    def ack(self, split: int) -> None:
        """Says every row of ``split`` was delivered; a split another consumer took over meanwhile is logged."""
        try:
            request = AckRequest(job_id=self._job_id, split=split, consumer=self._consumer)
            self._call(self._stub.AckSplit, request)
        except UsageError as exc:
            _delivered_twice(split, str(exc))

    def ack_in_background(self, splits: list[int]) -> None:
        """Acks ``splits`` in the background (``close`` waits for them), unless the process is exiting.

        A consumer garbage-collected while Python shuts down cannot start
        calls any more: those splits' leases lapse, as a dead consumer's do,
        and other consumers of the job deliver them again (logged).
        """
        try:
            for split in splits:
                self._background.submit(self.ack, split)
        except RuntimeError:  # the pool or the interpreter is shutting down
            log.info(
                "consumer %s stopped while its process exits: splits %s were delivered but not acknowledged; "
                "their leases lapse and other consumers of the job deliver them again",
                self._consumer,
                splits,
            )

    @property
    def lease_seconds(self) -> float:
        return self._lease_seconds


def _delivered_twice(split: int, why: str) -> None:
    log.warning("split %d was delivered here and by another consumer (this one's lease lapsed): %s", split, why)
