"""One distributed_epoch epoch as the consumer reads it (docs/architecture.md §5.5).

distributed_epoch (``DistributedEpoch``): the order of this consumer's
assignments and the delivery bookkeeping; leasing, acknowledging and renewing
are the ``LeaseClient``'s (``leases``), streaming the splits from the workers
the ``ReadAhead``'s (``read_ahead``). A split is acknowledged once every row of
it was delivered in a batch. parallel_epochs, where every worker streams the
whole snapshot, is ``parallel_reads``'.

Workers send rows in delivery order, cut where this consumer cuts its batches
(``worker_clients.Cut``): a batch that arrived whole is handed out as it
arrived, and the consumer copies only the batches that straddle two splits.

Where the consumer stands in the epoch is its ``Cursor`` (``cursor``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator

from reader.core.allocator import Columns
from reader.service.client.connection import ServiceConnection
from reader.service.client.cursor import Cursor
from reader.service.client.first_lease import FirstLease
from reader.service.client.leases import LeaseClient
from reader.service.client.read_ahead import READ_AHEAD_SPLITS, ReadAhead, SplitStream
from reader.service.client.worker_clients import Cut, WorkerClients
from reader.service.delivery import Delivered, DeliveryBatcher
from reader.service.splits import SplitOrder
from schemas.service_pb2 import JobRequest

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05
#: A consumer waiting this long for other consumers' splits at an epoch's end says so (``_WaitForOthers``).
WAIT_LOGGED_SECONDS = 5.0


def epoch_batches(
    connection: ServiceConnection,
    workers: WorkerClients,
    order_of: Callable[[int, int], SplitOrder],
    request: JobRequest,
    cursor: Cursor,
    batcher: DeliveryBatcher,
    first: FirstLease | None = None,
) -> Iterator[Columns]:
    """One distributed_epoch epoch of the job ``request`` names, from where ``cursor`` stands, as ``batcher`` cuts it.

    ``order_of(seed, epoch)``: the job's splits in an epoch (``ServiceSource.split_order``).
    ``first``: the consumer's first lease of its last epoch, whose split this
    epoch opens while its job request is answered; updated with this epoch's.
    """
    stub = connection.dispatcher()

    def live_workers() -> list[str]:
        return list(connection.call(stub.GetJob, request).workers)

    first = first or FirstLease()
    with contextlib.ExitStack() as closing:
        job_reply = connection.call_ahead(stub.GetJob, _leasing(request, cursor))
        expected = None
        if not cursor.held and cursor.next_index == 0:  # not a restored consumer: it re-reads its own splits first
            expected = first.open_split(workers, live_workers, order_of, request.iteration, batcher.batch_size)
        if expected is not None:
            closing.callback(expected.close)  # until the read-ahead holds it
        job = job_reply.result()
        cursor.restoring = None  # the job was taken back to the state restored
        first.remember(job, expected.read if expected else None)
        leases = closing.enter_context(contextlib.closing(LeaseClient(connection, stub, job, cursor.consumer)))
        same_order = expected is not None and expected.read.seed == job.seed
        in_order = expected.read.order if same_order else order_of(job.seed, request.iteration)
        read_ahead = ReadAhead(workers, live_workers, in_order, job.seed, request.iteration, expected)
        closing.enter_context(contextlib.closing(read_ahead))
        yield from DistributedEpoch(leases, read_ahead, in_order, cursor, batcher).batches(first_leases=job)


def _leasing(request: JobRequest, cursor: Cursor) -> JobRequest:
    """``request`` also leasing the consumer's first assignments, when it holds none to re-read first.

    One round trip instead of two before the epoch's first split can be asked
    of a worker. A restored consumer that holds assignments re-reads them
    first, in order (``DistributedEpoch._resumed``), so it leases separately.
    """
    if cursor.held:
        return request
    leasing = JobRequest()
    leasing.CopyFrom(request)
    leasing.lease_index = cursor.next_index
    leasing.lease_count = READ_AHEAD_SPLITS
    return leasing


class DistributedEpoch:
    """One consumer's distributed_epoch: its assignments, in order, cut into batches.

    A restored cursor first re-reads the assignments it held (from the rows it
    had delivered), then asks for assignment ``next_index`` and on: the
    dispatcher answers with the split it gave this consumer before (re-read
    after a restore), or a new one. Up to ``READ_AHEAD_SPLITS`` leased splits
    are streamed ahead while batches are cut, always consumed in assignment
    order so a restore repeats the order; one lease round trip, in the
    background, tops the read-ahead up. A split is acknowledged when all its
    rows were delivered in batches: the ack travels with the next lease
    request. When no split is pending for now (other consumers hold the last
    ones), the partial batch is delivered so that this consumer's own splits
    can be acknowledged and nobody waits on anybody.
    """

    def __init__(
        self,
        leases: LeaseClient,
        read_ahead: ReadAhead,
        order: SplitOrder,
        cursor: Cursor,
        batcher: DeliveryBatcher,
    ) -> None:
        self._leases = leases
        self._read_ahead = read_ahead
        self._cursor = cursor
        self._batcher = batcher
        self._order = order
        #: Rows per split, of the splits this consumer was given (not all of the job's: see ``splits.JobOrder``).
        self._rows_of: dict[int, int] = {}
        self._split_of: dict[int, int] = {}
        #: Assignments delivered whole whose acks were not sent yet: the next lease request carries them.
        self._unacked: list[int] = []
        #: Rows of the splits started since the batcher was last emptied: where the next split's rows fall
        #: in the batches, so its worker can cut them there.
        self._rows_started = 0

    def _split_rows(self, split: int) -> int:
        if split not in self._rows_of:
            self._rows_of[split] = self._order.split_rows(split)
        return self._rows_of[split]

    def _start(self, leased, workers, offset: int) -> tuple[int, SplitStream]:
        self._split_of[leased.index] = leased.split
        batch_size = self._batcher.batch_size
        cut = Cut(batch_size, -self._rows_started % batch_size)
        self._rows_started += self._split_rows(leased.split) - offset
        return leased.index, self._read_ahead.start(leased.split, workers, offset, cut)

    def _hand_out(self, cut: Iterator[tuple[Columns, Delivered]]) -> Iterator[Columns]:
        for batch, delivered in cut:
            self._deliver(delivered)
            if batch is not None:
                yield batch

    def _deliver(self, delivered: Delivered) -> None:
        """Counts delivered rows; a split whose rows were all delivered is to be acknowledged.

        Its ack travels with the next lease request (one round trip per lease
        instead of one more per split). A split stays in the cursor (fully
        delivered) until its ack is confirmed, so a state saved in between
        makes the restored consumer send the ack again instead of leaving the
        split unacknowledged forever.
        """
        self._cursor.deliver(delivered)
        for index, _ in delivered:
            if self._cursor.held[index] == self._split_rows(self._split_of[index]):
                self._unacked.append(index)

    def _acks_confirmed(self, indices: list[int]) -> None:
        for index in indices:
            del self._cursor.held[index]

    def _send_unacked(self) -> None:
        """When the consumer stops reading mid-epoch: the acks not sent yet go out in the background.

        Without them the splits' leases would lapse and other consumers of
        the job deliver those rows again. ``LeaseClient.close`` waits for them.
        """
        self._leases.ack_in_background([self._split_of[index] for index in self._unacked])
        self._unacked = []

    def _resumed(self) -> list[tuple[int, SplitStream]]:
        """Streams of the assignments a restored cursor held, from the rows it had delivered."""
        streams = []
        for index, delivered in list(self._cursor.held.items()):
            reply = self._leases.lease(index, 1)
            (leased,) = reply.splits
            if leased.taken_over:
                log.warning(
                    "split %d was taken over by another consumer after this consumer's lease lapsed; "
                    "its first %d rows were delivered here and will be delivered again there",
                    leased.split,
                    delivered,
                )
                del self._cursor.held[index]
            elif delivered == self._split_rows(leased.split):
                self._leases.ack(leased.split)  # delivered whole before the state was saved, ack unconfirmed
                del self._cursor.held[index]
            else:
                streams.append(self._start(leased, reply.workers, delivered))
        return streams

    def _lease_due(self, in_flight: collections.deque, none_pending: bool) -> bool:
        """Whether to send a lease request now.

        To top the read-ahead up once half of it was read; to ask again once
        nothing is in flight; and, once no split is pending (the epoch's
        tail, where no top-up comes), to carry the acks of splits just
        delivered, so that they are not held back to the epoch's end (a
        consumer that dies then leaves fewer delivered rows to deliver again).
        """
        if not in_flight:
            return True
        if none_pending:
            return bool(self._unacked)
        return len(in_flight) <= READ_AHEAD_SPLITS // 2

    def _start_lease(self, in_flight: collections.deque) -> _Leasing:
        """Asks for enough assignments to top the read-ahead up (one at least), with the acks due, in the background."""
        wanted = max(1, READ_AHEAD_SPLITS - len(in_flight))
        acked, self._unacked = self._unacked, []
        reply = self._leases.lease_later(self._cursor.next_index, wanted, [self._split_of[i] for i in acked])
        return _Leasing(reply, wanted, acked)

    def _take_leases(self, reply, wanted: int, in_flight: collections.deque) -> tuple[bool, bool]:
        """Starts streaming the leased splits; returns (no split pending for now, end of epoch)."""
        for leased in reply.splits:
            self._cursor.next_index += 1
            if not leased.taken_over:  # a split partly delivered before a restore starts where it stood
                self._cursor.held[leased.index] = leased.offset
                in_flight.append(self._start(leased, reply.workers, leased.offset))
        return len(reply.splits) < wanted, reply.end_of_epoch

    def batches(self, first_leases) -> Iterator[Columns]:
        """The epoch's batches; ``first_leases``: the job's reply, with the leases asked for with it (or none)."""
        try:
            yield from self._batches(first_leases)
        except GeneratorExit:
            self._send_unacked()
            raise

    def _batches(self, first_leases) -> Iterator[Columns]:
        in_flight: collections.deque = collections.deque(self._resumed())
        leasing: _Leasing | None = None
        none_pending, end_of_epoch, idle = False, False, False
        waiting: _WaitForOthers | None = None
        if first_leases.splits or first_leases.end_of_epoch:
            none_pending, end_of_epoch = self._take_leases(first_leases, READ_AHEAD_SPLITS, in_flight)
        while True:
            if leasing is None and self._lease_due(in_flight, none_pending):
                leasing = self._start_lease(in_flight)
            if leasing is not None and (leasing.reply.done() or not in_flight):
                none_pending, end_of_epoch = self._take_leases(leasing.reply.result(), leasing.wanted, in_flight)
                self._acks_confirmed(leasing.acked)
                leasing = None
            if not in_flight:
                yield from self._hand_out(iter([self._batcher.remainder()]))
                self._rows_started = 0
                if self._unacked:  # the remainder completed splits: their acks go with the next lease
                    continue
                if end_of_epoch:
                    return
                if idle:  # other consumers hold the last splits; one may die and free its split
                    waiting = waiting or _WaitForOthers(self._cursor.consumer, self._leases.lease_seconds)
                    waiting.still()
                    time.sleep(POLL_SECONDS)
                none_pending, idle = False, True
                continue
            idle, waiting = False, None
            index, stream = in_flight.popleft()
            for batch in stream.batches():
                self._batcher.add(index, batch)
                yield from self._hand_out(self._batcher.full_batches())


class _WaitForOthers:
    """Logs once when a consumer has waited ``WAIT_LOGGED_SECONDS`` for splits other consumers hold.

    At an epoch's end a consumer waits until every split is delivered, as one
    of the others may stop and leave its splits to it. A wait of seconds is
    not a slow peer but a stopped one (Ctrl-C, a crash) whose leases have not
    lapsed yet: say so rather than wait in silence.
    """

    def __init__(self, consumer: str, lease_seconds: float) -> None:
        self._consumer = consumer
        self._lease_seconds = lease_seconds
        self._since = time.monotonic()
        self._logged = False

    def still(self) -> None:
        if not self._logged and time.monotonic() - self._since >= WAIT_LOGGED_SECONDS:
            self._logged = True
            log.warning(
                "consumer %s: every split of this epoch is delivered or leased to other consumers of the job; "
                "waiting for theirs (a consumer that stopped frees its splits when its lease lapses, within %.0f s)",
                self._consumer,
                self._lease_seconds,
            )


@dataclasses.dataclass
class _Leasing:
    """A lease request in flight: its reply, how many assignments it asked for, the acks it carries."""

    reply: concurrent.futures.Future
    wanted: int
    acked: list[int]
