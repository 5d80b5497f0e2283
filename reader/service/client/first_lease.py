"""The split a distributed_epoch consumer expects to lease first, opened while its epoch's job request is answered.

See ``FirstLease``; ``epoch_reads.epoch_batches`` uses it and ``ServiceSource`` holds it.
"""

from __future__ import annotations

from collections.abc import Callable

from reader.service.client.read_ahead import SplitStream, open_expected
from reader.service.client.worker_clients import Cut, SplitRead, WorkerClients
from reader.service.splits import SplitOrder


class FirstLease:
    """The split a consumer leased first in its last epoch, by which seed, from which workers.

    A warm epoch's first batch waited on a chain: the job request with the
    first leases (a round trip to the dispatcher), then the first split's
    stream (a round trip to a worker), the worker's gather of the batch, its
    transfer. The dispatcher gives a new epoch's splits out first come,
    first served, in split order, so a consumer reading alone, or arriving
    in the same place among the job's consumers, leases the same split first
    every epoch. So ``epoch_batches`` sends the job request on one of the
    connection's threads (``ServiceConnection.call_ahead``) and opens that
    split's stream (``open_split``) at once: the worker gathers the first
    batch while the dispatcher answers. Its rows are delivered only if the
    dispatcher leased that split to this consumer, by the same seed;
    otherwise the stream is cancelled, and the worker gathered one batch for
    nothing. A consumer whose guess was wrong does not guess in its next
    epoch (consumers of a shared job arriving in a new order each epoch
    waste at most every other). The job request used to wait for the
    split's stream to open (``do_get`` returns once the worker answered):
    sent first, the first batch comes sooner (docs/architecture.md §9.6).

    A ``ServiceSource`` holds one for the iterators it starts (each epoch of
    ``for batch in dataset`` is a new one). Iterators reading at once may
    overwrite each other's: a guess gone wrong, which costs only that batch.
    """

    def __init__(self) -> None:
        #: (split, seed, workers) to open in the next epoch, replaced whole; None: nothing to guess.
        self._next: tuple[int, int, list[str]] | None = None

    def remember(self, job, guessed: SplitRead | None) -> None:
        """This epoch's first lease (a ``GetJob`` reply that leased) for the next epoch, unless ``guessed`` missed."""
        leased = job.splits[0] if job.splits else None
        if leased is None or leased.taken_over:
            self._next = None
            return
        missed = guessed is not None and (guessed.split, guessed.seed) != (leased.split, job.seed)
        self._next = None if missed else (leased.split, job.seed, list(job.workers))

    def open_split(
        self,
        workers: WorkerClients,
        live_workers: Callable[[], list[str]],
        order_of: Callable[[int, int], SplitOrder],
        epoch: int,
        batch_rows: int,
    ) -> SplitStream | None:
        """The remembered split's stream in ``epoch``, opened now; None when there is none, or its worker failed.

        ``order_of(seed, epoch)``: the job's splits in that epoch (``ServiceSource.split_order``).
        """
        if self._next is None:
            return None
        split, seed, last_workers = self._next
        in_order = order_of(seed, epoch)
        read = SplitRead(last_workers, live_workers, in_order, seed, epoch, split, 0, Cut(batch_rows), expected=True)
        return open_expected(workers, read)
