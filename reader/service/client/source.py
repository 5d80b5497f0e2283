"""The consumer side of the reader service: the source behind ``reader.distributed_dataset(service=...)``.

``ServiceSource`` is a ``reader.source.StepSource``: ``DistributedDataset``
supplies per-replica output, adapters, placement, ``tf.distribute`` and Keras
exactly as for local reads. It holds the connection and the job (name and
seed) its iterators read; a copy for a ``tf.distribute`` input context shares
that job. How an epoch is read is in ``epoch_reads`` (distributed_epoch:
leased splits, each delivered exactly once, also across worker failures;
parallel_epochs: every worker's whole stream), the connections in
``connection`` and ``worker_clients``.

``ServiceIterator`` batches rows and splits them across replicas exactly as
the local reader does, and resumes with ``get_state``/``set_state``
(envelope in ``reader.core.state``): the state names the job, this consumer,
the epoch's step and how many rows of each split (or worker stream) it
delivered. A restored distributed_epoch consumer is a new consumer of the job
whose first job request takes the job back to the state (``rollback``), so
one state restores any number of consumers; a parallel_epochs one resumes
each worker's stream where it stood.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator

from reader.core import allocator, reaper
from reader.core.allocator import Columns
from reader.core.mixture import Mixture
from reader.core.mixture import refusal as mixture_refusal
from reader.core.options import ReaderOptions
from reader.core.pipeline import row_bytes, window_rows
from reader.core.plan import InputContext, ShardPolicy, all_blocks, replica_ranges
from reader.core.state import SERVICE, StateEnvelope, rows_config
from reader.core.stats import ReaderClock
from reader.core.union import Readable, SnapshotUnion
from reader.service import protocol, splits
from reader.service.client.connection import ServiceConnection
from reader.service.client.cursor import Cursor, Restoring, new_consumer
from reader.service.client.epoch_reads import epoch_batches
from reader.service.client.first_lease import FirstLease
from reader.service.client.parallel_reads import FirstWorkerStream, parallel_batches
from reader.service.client.worker_clients import WorkerClients
from reader.service.delivery import DeliveryBatcher
from reader.service.mixture_jobs import MixtureJob, MixtureSplits
from reader.service.protocol import ANONYMOUS_JOB, DISTRIBUTED
from schemas import paths
from schemas.errors import UsageError
from schemas.service_pb2 import JobRequest

_FIELDS = ("job_name", "seed", "epoch", "consumer", "next_index", "held", "stop_epoch", "finished")  # and "step"


@dataclasses.dataclass(frozen=True)
class ServiceJob:
    """The job a consumer reads: consumers sharing ``name`` share its epochs; ``seed`` orders its splits."""

    name: str
    seed: int

    @classmethod
    def new(cls, name: str | None, seed: int | None) -> ServiceJob:
        """A job for a new dataset: unnamed ones get a unique name, unseeded ones a random seed."""
        return cls(
            name or f"{ANONYMOUS_JOB}-{uuid.uuid4().hex}", seed if seed is not None else int(uuid.uuid4().int % (2**62))
        )


def _refuse_local_reading(options: ReaderOptions, *, mixture: bool) -> None:
    """What tunes the local reader is refused with ``service=``, a group per line: the workers read the blocks
    (with their own flags and cache), and the job's order, seeded by ``seed=`` and the epoch, shuffles them. A
    mixture's ``shuffle_buffer_size`` stays: it sizes its windows, which are the job's splits."""
    if tuning := options.read.tuning_given():
        given = ", ".join(f"{name}={value!r}" for name, value in tuning.items())
        raise UsageError(
            f"read=ReadOptions({given}) tunes the local reader; with service= the workers read the blocks with "
            "their own settings (only verify_checksums applies): drop those, or read without service="
        )
    if options.cache.dir is not None:
        raise UsageError(
            f"cache=CacheOptions(dir={options.cache.dir!r}) keeps shards for the local reader; with service= the "
            "workers have their own cache (python -m reader.service worker --cache_dir): drop cache="
        )
    order = {
        "shard_policy": options.shard_policy.value if options.shard_policy is not ShardPolicy.AUTO else None,
        "shuffle": False if not options.shuffle else None,
        "shuffle_buffer_size": None if mixture else options.shuffle_buffer_size,
        "reshuffle_each_epoch": False if not options.reshuffle_each_epoch else None,
    }
    if given := ", ".join(f"{name}={value!r}" for name, value in order.items() if value is not None):
        raise UsageError(
            f"{given}: with service= the job's order, seeded by seed= and the epoch, shuffles the blocks anew every "
            "epoch, and processing_mode decides which rows each consumer gets; drop them, or read without service="
        )


class ServiceSource:
    """Steps streamed from the reader service's workers for one input pipeline."""

    def __init__(
        self,
        snapshot: Readable | Mixture,
        options: ReaderOptions,
        connection: ServiceConnection,
        job: ServiceJob | None = None,
        workers: WorkerClients | None = None,
    ) -> None:
        self.columns = snapshot.readable_columns(options.columns)
        _refuse_local_reading(options, mixture=isinstance(snapshot, Mixture))
        self.snapshot = snapshot
        #: A mixture's definition as its servers are sent it (JSON; its splits are windows), or "".
        self.mixture_definition = ""
        if isinstance(snapshot, Mixture):
            batch = options.global_batch_size // options.context.num_input_pipelines
            window = window_rows(options, row_bytes(snapshot, self.columns))
            mixture = MixtureJob.of(snapshot, batch, window, options.drop_remainder)
            self.mixture_definition = mixture.to_json()
            #: Its windows' rows, the same every epoch whatever the seed.
            self._mixture_splits = MixtureSplits(mixture.split_rows(snapshot))
            self.rows = mixture.plan(snapshot).delivered_rows
        else:
            #: Its blocks in stored order, listed once for every epoch (each epoch orders them its own way).
            self._blocks = all_blocks(snapshot.block_rows)
            self.rows = sum(piece.rows for piece in self._blocks)
        self.options = options
        self.connection = connection
        # One job for every iterator of this source and of its per-context copies (restores aside).
        self.job = job or ServiceJob.new(connection.job_name, options.seed)
        #: The workers' connections, shared by every iterator (an epoch is one) and per-context copy: connecting
        #: them anew each epoch held up its first block by a few ms. Closed when the last user lets go.
        self.workers = workers or WorkerClients(
            connection, *_sent(snapshot), self.columns, options.read.verify_checksums, self.mixture_definition
        )
        #: distributed_epoch: the first split its last epoch leased, opened while the next epoch's job request is
        #: answered; parallel_epochs: the last job reply, by which the next epoch's first stream is opened then.
        self.first_lease = FirstLease()
        self.first_worker_stream = FirstWorkerStream()

    def split_order(self, seed: int, epoch: int) -> splits.SplitOrder:
        """The job's splits in ``epoch`` by ``seed``: a snapshot's blocks in the job's order, or a mixture's windows
        (their rows are the plan's, whatever the seed and epoch)."""
        if self.mixture_definition:
            return self._mixture_splits
        return splits.job_blocks(self._blocks, seed, epoch)

    @property
    def steps_per_epoch(self) -> int | None:
        """distributed_epoch: the steps of one epoch of the whole job, ``ceil(num_rows / per-pipeline batch)``
        (rounded down with ``drop_remainder``); None in parallel_epochs.

        distributed_epoch: a consumer reading the job alone (no ``job_name``,
        one input pipeline: ``exact_steps``) takes exactly these steps every
        epoch. Consumers sharing the job (a ``job_name``, or the input
        pipelines of one ``tf.distribute`` job) split its rows first come,
        first served: together they take about these steps, each its own
        share, which depends on the splits it wins, and each may end on a
        partial step of its own. parallel_epochs: every worker streams the
        whole snapshot, so an epoch is ``ceil(workers * num_rows /
        per-pipeline batch)`` steps for the workers live when it starts, which
        may change from epoch to epoch: no count is right before then.
        """
        if self.connection.mode != DISTRIBUTED:
            return None
        batch = self.options.global_batch_size // self.options.context.num_input_pipelines
        whole, partial = divmod(self.rows, batch)
        return whole + (1 if partial and not self.options.drop_remainder else 0)

    @property
    def exact_steps(self) -> bool:
        """Whether every epoch of this pipeline is ``steps_per_epoch`` steps: only for a consumer alone in a
        distributed_epoch job (what ``as_tf_dataset`` tells tf.data as its cardinality)."""
        alone = self.connection.job_name is None and self.options.context.num_input_pipelines == 1
        return self.connection.mode == DISTRIBUTED and alone

    def iterator(
        self, first_epoch: int, adapt: Callable[[list], object], clock: ReaderClock | None = None
    ) -> ServiceIterator:
        return ServiceIterator(self, first_epoch, adapt, clock or ReaderClock())

    def for_context(self, context: InputContext) -> ServiceSource:
        return ServiceSource(
            self.snapshot, dataclasses.replace(self.options, context=context), self.connection, self.job, self.workers
        )

    def to_torch(self, map_fn: Callable | None):
        raise UsageError("to_torch() reads locally; with service= iterate the dataset (output='torch') instead")

    def envelope(self) -> StateEnvelope:
        """What must match for a state to mean the same rows (the seed and job travel in the state).

        A distributed_epoch state counts rows per split, so it means the same rows only with splits of
        as many blocks: one saved by a snapfeed version that cut them otherwise is refused.
        """
        must_match = {**rows_config(self.snapshot, self.options, self.columns), "mode": self.connection.mode}
        if self.connection.mode == DISTRIBUTED:
            must_match["blocks per split (snapfeed version)"] = splits.BLOCKS_PER_SPLIT
        return StateEnvelope(SERVICE, must_match)


class ServiceIterator:
    """Steps of a service job; ``get_state()``/``set_state()`` resume exactly (JSON-serializable).

    The job (name and seed) is this iterator's: a restore reads the job its state names.
    """

    def __init__(
        self, source: ServiceSource, first_epoch: int, adapt: Callable[[list], object], clock: ReaderClock
    ) -> None:
        """``clock`` counts the time spent receiving steps from the workers (``receive``)."""
        allocator.keep_freed_batches()  # batches are fresh arrays here too
        self._clock = clock
        self._source = source
        self._connection = source.connection
        self._envelope = source.envelope()
        self._adapt = adapt
        self._job = source.job
        epochs = source.options.num_epochs
        self._stop_epoch = None if epochs is None else first_epoch + epochs
        self._cursor = Cursor(first_epoch, new_consumer(self._job.name))
        self._epoch = _Epoch()
        self._finished = False
        # Dropped unclosed, its epoch is closed on the reaper thread (acks sent, leases and streams let go).
        reaper.on_collect(self, self._epoch.close)

    def __iter__(self) -> ServiceIterator:
        return self

    @property
    def delivered_epoch(self) -> int:
        """The epoch of the step delivered last (the cursor moves on when the next epoch's first is asked for)."""
        return self._cursor.epoch

    def __next__(self):
        while not self._finished:
            if self._epoch.steps is None:
                self._epoch.steps = _epoch_steps(self._source, self._job, self._cursor)
            try:
                step = self._clock.run("receive", next, self._epoch.steps)
            except StopIteration:
                self._epoch.steps = None
                self._cursor = Cursor(self._cursor.epoch + 1, self._cursor.consumer)
                self._finished = self._stop_epoch is not None and self._cursor.epoch >= self._stop_epoch
            else:
                self._cursor.step += 1
                return self._adapt(step)
        self.close()
        raise StopIteration

    # -- state ---------------------------------------------------------------------------------
    def get_state(self) -> dict:
        cursor = self._cursor
        if cursor.restoring is not None:  # restored, and nothing read since: the same state
            return cursor.restoring.state
        return self._envelope.seal(
            {
                "job_name": self._job.name,
                "seed": self._job.seed,
                "epoch": cursor.epoch,
                "consumer": cursor.consumer,
                "next_index": cursor.next_index,
                "held": [[source, rows] for source, rows in cursor.held.items()],
                "step": cursor.step,
                "stop_epoch": self._stop_epoch,
                "finished": self._finished,
                "saved_on": self._source.snapshot.identity,
            }
        )

    def set_state(self, state: dict) -> None:
        self._envelope.check_header(state, _FIELDS)
        if "saved_on" in state and (refused := mixture_refusal(state["saved_on"], self._source.snapshot)):
            raise UsageError(refused)
        self._envelope.check_digest(state)
        seed = self._source.options.seed
        if seed is not None and seed != int(state["seed"]):
            raise UsageError(
                f"this reader-service state is of job {state['job_name']!r} seeded {state['seed']}, and this dataset "
                f"was built with seed={seed}; build it with seed={state['seed']} (or no seed=) to restore it"
            )
        self.close()
        self._job = ServiceJob(state["job_name"], int(state["seed"]))
        epoch, step = int(state["epoch"]), int(state.get("step") or 0)
        if self._connection.mode == DISTRIBUTED:
            # a new consumer of the job, which its first job request takes back to the state
            self._cursor = Cursor(epoch, new_consumer(self._job.name), step=step, restoring=Restoring.of(state))
        else:  # parallel_epochs: the same consumer, each worker's stream from the rows it delivered
            held = {s: int(r) for s, r in state["held"]}
            self._cursor = Cursor(epoch, state["consumer"], int(state["next_index"]), held, step)
        self._stop_epoch = state["stop_epoch"]
        self._finished = bool(state["finished"])

    def close(self) -> None:
        """Stops reading (idempotent). Leases are kept until they expire, so a restore can re-claim them."""
        self._epoch.close()


class _Epoch:
    """The steps of the epoch an iterator reads, apart from the iterator: closed by its ``close()``, or on the
    reaper thread once it was dropped (``reader.core.reaper``; a finalizer must not send acks or join)."""

    __slots__ = ("steps",)

    def __init__(self) -> None:
        self.steps: Iterator[list[Columns]] | None = None

    def close(self) -> None:
        steps, self.steps = self.steps, None
        if steps is not None:
            steps.close()


def _epoch_steps(source: ServiceSource, job: ServiceJob, cursor: Cursor) -> Iterator[list[Columns]]:
    """One epoch of ``job`` from where ``cursor`` stands, in steps of per-replica batches. It refers to no
    iterator: the iterator's finalizer hands it to the reaper thread to be closed."""
    connection, options = source.connection, source.options
    context = options.context
    batcher = DeliveryBatcher(
        options.global_batch_size // context.num_input_pipelines, drop_remainder=options.drop_remainder
    )

    def step(batch: Columns) -> list[Columns]:
        rows = len(next(iter(batch.values())))
        return [
            {n: v[lo:hi] for n, v in batch.items()} for lo, hi in replica_ranges(rows, context.replicas_per_pipeline)
        ]

    sent_snapshot, sent_run = _sent(source.snapshot)
    request = JobRequest(
        job_name=job.name,
        iteration=cursor.epoch,
        snapshot=sent_snapshot,
        run_id=sent_run,
        processing_mode=connection.mode,
        consumer=cursor.consumer,
        seed=job.seed,
        start_step=cursor.step,
        batch_rows=batcher.batch_size,
        rollback=cursor.restoring.rollback if cursor.restoring else None,
        mixture=source.mixture_definition,
    )
    if connection.mode == DISTRIBUTED:
        order_of = source.split_order
        batches = epoch_batches(connection, source.workers, order_of, request, cursor, batcher, source.first_lease)
    else:
        batches = parallel_batches(
            connection, source.workers, source.rows, request, cursor, batcher, source.first_worker_stream
        )
    for batch in batches:
        yield step(batch)


def _sent(snapshot: Readable | Mixture) -> tuple[str, str]:
    """The snapshot's folder and run as servers are told them: absolute (they resolve paths against their own
    directory); a union's members', a line each (``protocol.members``); a mixture's sources' members, in order."""
    members = snapshot.members if isinstance(snapshot, SnapshotUnion | Mixture) else (snapshot,)
    return (
        protocol.joined(paths.absolute(member.path) for member in members),
        protocol.joined(member.metadata.run_id for member in members),
    )
