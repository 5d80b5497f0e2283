"""The dispatcher's state machine (docs/architecture.md §5.2, layer 1): jobs, splits, leases, acks, workers.

Pure: no gRPC, no clock, no I/O. Every call takes ``now``; every change is an
event (a frozen dataclass per kind: ``JobCreated`` ... ``StreamsRead``) that
``DispatchState.apply`` applies and the call returns, so the server can append
it to the ``--work_dir`` journal (``journal_line``: one JSON line) and a
restarted dispatcher rebuilds the same state by applying the same events
(``read_journal``, ``DispatchState.replay(events, now=...)``), as tf.data's
dispatcher applies its journaled ``Update``s.

Exactly-once per epoch in ``distributed_epoch`` (what tf.data's at-most-once
service does not give): a split is leased to one consumer at a time and is
done only when that consumer acknowledges it after receiving every row; a
lease that is not renewed (the consumer died) expires and the split goes back
to the pending queue for the other consumers of the job. A worker dying
mid-split does not touch the lease: the consumer resumes the split at its
row offset on another worker.

Every consumer also has an ordered list of the splits assigned to it (asked
for by index, so a reply lost to a dispatcher restart is asked for again), and
says at which step of the epoch it started and how many rows each of its steps
takes. A restored trainer takes the job back to its checkpoint
(``roll_back``, the rules in ``rollback``): the splits delivered after it are
pending again, partly delivered ones from the rows delivered (``offsets``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterable
from typing import ClassVar, TypeVar

from reader.service import rollback
from reader.service.mixture_jobs import MixtureJob
from reader.service.protocol import DISTRIBUTED, PARALLEL, PROCESSING_MODES
from reader.service.rollback import Restore, RollbackWait
from schemas.errors import FormatVersionError, InputDataError, UsageError

DEFAULT_LEASE_SECONDS = 30.0
DEFAULT_WORKER_TIMEOUT_SECONDS = 15.0


class SplitState(str, enum.Enum):
    PENDING = "pending"
    LEASED = "leased"
    DONE = "done"


@dataclasses.dataclass
class SplitStatus:
    state: SplitState = SplitState.PENDING
    consumer: str = ""
    lease_expiry: float = 0.0
    #: pending again after a lease expired: its next lease is a re-lease (``SplitTally.released``)
    expired: bool = False


@dataclasses.dataclass
class SplitTally:
    """What happened to a job's splits, counted as the events are applied (so a replayed journal counts the same):
    what the service's metrics report (``reader.service.metrics``) and the state itself does not keep."""

    #: leases granted: a split going from pending to leased (renewals not counted)
    leased: int = 0
    #: leases granted for a split whose previous lease expired (its consumer was presumed dead)
    released: int = 0
    #: splits acknowledged: every row delivered
    delivered: int = 0
    #: leases that expired unrenewed
    expired: int = 0
    #: splits done that a restore took back (pending again): the counts above only grow, as metrics' counters do
    taken_back: int = 0


@dataclasses.dataclass(frozen=True)
class JobKey:
    """A job is one epoch (iteration) of one named stream; unnamed jobs get a unique name."""

    job_name: str
    iteration: int


@dataclasses.dataclass
class Job:
    job_id: int
    key: JobKey
    snapshot: str
    run_id: str
    mode: str
    num_splits: int
    seed: int
    splits: list[SplitStatus]
    consumers: set[str] = dataclasses.field(default_factory=set)
    #: consumer -> the splits assigned to it, in order (restored consumers re-read theirs by index)
    assignments: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    #: parallel_epochs: the consumers that read every worker's stream to its end
    streams_read: set[str] = dataclasses.field(default_factory=set)
    #: the splits leased now: what ``expire_leases`` looks at, on every lease, without walking every split of
    #: every job the dispatcher ever had (a job is an epoch; that walk grew to milliseconds per lease)
    leased: set[int] = dataclasses.field(default_factory=set)
    tally: SplitTally = dataclasses.field(default_factory=SplitTally)
    #: consumer -> (the epoch's step it started at, rows per step): how far a restore takes it back
    steps: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    #: split -> rows delivered before a restore took it back: its next lease starts there
    offsets: dict[int, int] = dataclasses.field(default_factory=dict)
    #: split -> the consumer of its latest assignment, and (consumer, split) -> the row it started from
    holders: dict[int, str] = dataclasses.field(default_factory=dict)
    starts: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    #: a mixture job's definition (its splits are the mixture's windows); "" for a snapshot's job
    mixture: str = ""

    def split_now(self, split: int) -> tuple[str, str, int]:
        """(state, consumer, rows delivered before a restore) of ``split``: what a restore compares against."""
        status = self.splits[split]
        return status.state.value, status.consumer, self.offsets.get(split, 0)

    def set_split(self, index: int, status: SplitStatus) -> None:
        """Every change of a split's state goes through here, so ``leased`` stays right."""
        self.splits[index] = status
        if status.state is SplitState.LEASED:
            self.leased.add(index)
        else:
            self.leased.discard(index)

    @property
    def finished(self) -> bool:
        """distributed_epoch: every split acknowledged; parallel_epochs (no splits are leased): every consumer
        known to the job read all its streams."""
        if self.mode == PARALLEL:
            return bool(self.streams_read) and self.consumers <= self.streams_read
        # a split is done once, unless a restore takes it back
        return self.tally.delivered - self.tally.taken_back == self.num_splits

    def counts(self) -> dict[str, int]:
        counts = {state.value: 0 for state in SplitState}
        for split in self.splits:
            counts[split.state.value] += 1
        return counts


@dataclasses.dataclass(frozen=True)
class Lease:
    """What ``lease_split`` answers: a split to read, nothing for now, or the end of the epoch.

    ``taken_over``: an assignment asked for again by index whose split another
    consumer took over after this consumer's lease expired; that consumer
    delivers its rows, so this one skips it.
    """

    split: int | None
    end_of_epoch: bool
    index: int = -1
    taken_over: bool = False
    #: the split's rows before this one were delivered before a restore: its stream starts here
    offset: int = 0


# -- events: what the journal holds, one JSON object a line ------------------------------------------
#: What a JSON value of each field type may be (``bool`` is an ``int`` to Python, not to a journal).
_JSON_TYPES = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,)}


class _Event:
    """A journal event: its ``KIND`` is the line's ``"event"``, its fields the line's other keys."""

    KIND: ClassVar[str]

    def to_json(self) -> dict:
        """The event as its journal line's object (``journal_line`` writes it with sorted keys)."""
        return {"event": self.KIND, **{field.name: getattr(self, field.name) for field in dataclasses.fields(self)}}

    @classmethod
    def from_json(cls, obj: dict):
        """The event of a journal line's object; ValueError naming the field that is missing or of another type.

        Keys the event does not know are passed over, as they always were.
        """
        values = {}
        for field in dataclasses.fields(cls):
            if field.name not in obj:
                if field.default is dataclasses.MISSING:
                    raise ValueError(f"kind {cls.KIND!r} without {field.name!r}")
                continue
            value = values[field.name] = obj[field.name]
            if field.type in _JSON_TYPES and (
                not isinstance(value, _JSON_TYPES[field.type]) or (isinstance(value, bool) and field.type != "bool")
            ):
                raise ValueError(f"kind {cls.KIND!r} whose {field.name!r} is {value!r}, not of type {field.type}")
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class JobCreated(_Event):
    """A job (one epoch of one ``job_name``) was created on its first consumer's request."""

    KIND: ClassVar[str] = "job"
    job_id: int
    job_name: str
    iteration: int
    snapshot: str
    mode: str
    num_splits: int
    run_id: str = ""  # journals written before runs were named
    seed: int = 0
    mixture: str = ""  # a mixture job's definition (reader.service.mixture_jobs); written only for one

    def to_json(self) -> dict:
        fields = super().to_json()
        if not self.mixture:
            del fields["mixture"]  # a snapshot job's line as before mixtures
        return fields


@dataclasses.dataclass(frozen=True)
class ConsumerJoined(_Event):
    """A consumer joined a job: a parallel_epochs one, or a distributed_epoch one telling its steps.

    ``start_step``, ``batch_rows``: the epoch's step it started at and its rows per step (how far a restore
    takes it back); written only with ``batch_rows`` (0: not told, by a parallel_epochs or an older consumer).
    """

    KIND: ClassVar[str] = "consumer"
    job_id: int
    consumer: str
    start_step: int = 0
    batch_rows: int = 0

    def to_json(self) -> dict:
        obj = super().to_json()
        if not self.batch_rows:
            del obj["start_step"], obj["batch_rows"]
        return obj


@dataclasses.dataclass(frozen=True)
class SplitLeased(_Event):
    """A split was leased to a consumer until ``expiry``, or its lease renewed.

    ``assign``: a new assignment of the consumer's (appended to its list), not a renewal; ``offset``: the rows
    of it delivered before a restore took it back, where its stream starts. Each written only when set.
    """

    KIND: ClassVar[str] = "lease"
    job_id: int
    split: int
    consumer: str
    expiry: float
    assign: bool = False
    offset: int = 0

    def to_json(self) -> dict:
        obj = super().to_json()
        for name in ("assign", "offset"):
            if not obj[name]:
                del obj[name]
        return obj


@dataclasses.dataclass(frozen=True)
class LeaseExpired(_Event):
    """A lease was not renewed in time: the split is pending again (its consumer is presumed dead)."""

    KIND: ClassVar[str] = "expire"
    job_id: int
    split: int


@dataclasses.dataclass(frozen=True)
class SplitAcked(_Event):
    """A consumer delivered every row of a split: it is done."""

    KIND: ClassVar[str] = "ack"
    job_id: int
    split: int
    consumer: str


@dataclasses.dataclass(frozen=True)
class RolledBack(_Event):
    """A restore took a job back: ``done`` (split, consumer) are done, ``reopened`` (split, rows delivered)
    pending again from those rows (``rollback.changes``)."""

    KIND: ClassVar[str] = "rollback"
    job_id: int
    done: tuple[tuple[int, str], ...]
    reopened: tuple[tuple[int, int], ...]

    def to_json(self) -> dict:
        return {
            **super().to_json(),
            "done": [list(pair) for pair in self.done],
            "reopened": [list(pair) for pair in self.reopened],
        }

    @classmethod
    def from_json(cls, obj: dict):
        event = super().from_json(obj)
        try:
            done = tuple((split, consumer) for split, consumer in event.done)
            reopened = tuple((split, offset) for split, offset in event.reopened)
        except (TypeError, ValueError):
            raise ValueError("kind 'rollback' whose done and reopened are not lists of [split, ...] pairs") from None
        return dataclasses.replace(event, done=done, reopened=reopened)


@dataclasses.dataclass(frozen=True)
class StreamsRead(_Event):
    """parallel_epochs: a consumer read every worker's stream of the epoch to its end."""

    KIND: ClassVar[str] = "streams_read"
    job_id: int
    consumer: str


_E = TypeVar("_E", bound=_Event)
Event = JobCreated | ConsumerJoined | SplitLeased | LeaseExpired | SplitAcked | RolledBack | StreamsRead
#: journal line ``"event"`` -> its class
EVENTS: dict[str, type[Event]] = {
    kind.KIND: kind
    for kind in (JobCreated, ConsumerJoined, SplitLeased, LeaseExpired, SplitAcked, RolledBack, StreamsRead)
}


def event_from_json(obj) -> Event:
    """The event of one journal line's object; ValueError (FormatVersionError for a kind unknown) saying why not."""
    if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
        raise ValueError(f'{obj!r} is not a JSON object with an "event" kind')
    kind = obj["event"]
    if kind not in EVENTS:
        raise FormatVersionError(
            f"an event of kind {kind!r}, which this snapfeed does not know (kinds: {', '.join(EVENTS)})"
        )
    return EVENTS[kind].from_json(obj)


def journal_line(event: Event) -> str:
    """``event`` as its journal line (without the newline): JSON with sorted keys."""
    return json.dumps(event.to_json(), sort_keys=True)


def read_journal(lines: Iterable[str], path: str) -> list[Event]:
    """The events of a journal's ``lines`` (blank ones passed over), read from ``path`` (named in errors).

    A line that is not an event raises one error naming the file, the line and what to do:
    FormatVersionError for a kind this snapfeed does not know, InputDataError for a damaged line.
    """
    events = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            events.append(event_from_json(json.loads(line.strip())))
        except json.JSONDecodeError as exc:
            raise _damaged(path, number, f"not JSON: {exc.msg} (column {exc.colno})") from None
        except FormatVersionError as exc:
            raise FormatVersionError(
                f"dispatcher journal {path} line {number}: {exc}; it was written by a newer snapfeed: run that "
                "version's dispatcher on this work_dir, or start this one with another work_dir"
            ) from None
        except ValueError as exc:
            raise _damaged(path, number, str(exc)) from None
    return events


def _damaged(path: str, number: int, why: str) -> InputDataError:
    return InputDataError(
        f"dispatcher journal {path} line {number} is not a journal event ({why}): if it is the last line, cut short "
        "by a dispatcher stopped while writing it (its caller got no reply), delete it to resume from the lines "
        "before; else the journal is damaged: start the dispatcher with another work_dir"
    )


class DispatchState:
    def __init__(
        self,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        worker_timeout_seconds: float = DEFAULT_WORKER_TIMEOUT_SECONDS,
    ) -> None:
        if lease_seconds <= 0 or worker_timeout_seconds <= 0:
            raise UsageError("lease and worker timeouts must be positive")
        self.lease_seconds = lease_seconds
        self.worker_timeout_seconds = worker_timeout_seconds
        self.jobs: dict[int, Job] = {}
        self._by_key: dict[JobKey, int] = {}
        self.workers: dict[str, float] = {}  # address -> last heartbeat
        #: consumer -> when it last called (in memory): whether a restore may take it back (``rollback.liveness``)
        self.seen: dict[str, float] = {}
        #: when this dispatcher started: consumers of a replayed journal count as heard from then
        self._since = float("-inf")
        #: restored consumer -> when it first asked to take its job back (until it did): who called since is reading
        self._restoring: dict[str, float] = {}

    # -- workers -----------------------------------------------------------------------------
    def worker_heartbeat(self, address: str, *, now: float) -> None:
        self.workers[address] = now

    def worker_left(self, address: str) -> None:
        """A draining worker takes no new streams: it is no longer offered to consumers nor listed."""
        self.workers.pop(address, None)

    def live_workers(self, *, now: float) -> list[str]:
        return sorted(a for a, seen in self.workers.items() if now - seen <= self.worker_timeout_seconds)

    def touch(self, consumer: str, *, now: float) -> None:
        """``consumer`` called: it is reading, so a restore leaves its splits alone."""
        self.seen[consumer] = now

    # -- jobs ----------------------------------------------------------------------------------
    def get_or_create_job(
        self,
        *,
        job_name: str,
        iteration: int,
        snapshot: str,
        mode: str,
        num_splits: int,
        consumer: str,
        seed: int = 0,
        run_id: str = "",
        start_step: int = 0,
        batch_rows: int = 0,
        mixture: str = "",
    ) -> tuple[Job, list[Event]]:
        """The job for ``(job_name, iteration)``, created on first use; returns it and the events to journal.

        Consumers sharing a job_name share the job first-come first-served; one
        that arrives after the job finished joins it and finds the epoch over.
        A parallel_epochs job is finished when every consumer that joined read
        its streams, so joining is journaled there: a restarted dispatcher
        would otherwise call the job finished once any one consumer got there.
        A distributed_epoch consumer's joining is journaled with ``start_step``
        and ``batch_rows`` (given: a consumer of this version), which a restore
        of another consumer's state takes it back by.
        """
        if mode not in PROCESSING_MODES:
            raise UsageError(f"processing_mode={mode!r}; choose one of {', '.join(PROCESSING_MODES)}")
        if num_splits < 0 or iteration < 0 or not job_name:
            raise UsageError(f"bad job request: job_name={job_name!r} iteration={iteration} splits={num_splits}")
        key = JobKey(job_name, iteration)
        events: list[Event] = []
        if key not in self._by_key:
            job_id = len(self.jobs) + 1
            created = JobCreated(
                job_id, job_name, iteration, snapshot, mode, num_splits, run_id=run_id, seed=seed, mixture=mixture
            )
            events.append(self.apply(created))
        job = self.jobs[self._by_key[key]]
        if (job.snapshot, job.run_id, job.mode, job.num_splits) != (snapshot, run_id, mode, num_splits):
            raise UsageError(
                f"job_name {job_name!r} is already reading {job.snapshot} (run {job.run_id or '?'}, {job.mode}, "
                f"{job.num_splits} splits); consumers sharing a job_name must read the same snapshot run the same "
                f"way (after a rewrite, give the new run's readers another job_name)"
            )
        if job.mixture != mixture:
            raise UsageError(
                f"job_name {job_name!r} is already reading {_mixture_text(job.mixture)}; this consumer reads "
                f"{_mixture_text(mixture)}: consumers sharing a job_name must read the same mixture in batches of "
                f"the same size, or give this one another job_name"
            )
        if job.mode == PARALLEL and consumer not in job.consumers:
            events.append(self.apply(ConsumerJoined(job.job_id, consumer)))
        elif job.mode == DISTRIBUTED and batch_rows > 0 and consumer not in job.steps:
            events.append(self.apply(ConsumerJoined(job.job_id, consumer, start_step, batch_rows)))
        job.consumers.add(consumer)
        return job, events

    def _consumer_joined(self, event: ConsumerJoined) -> None:
        job = self.jobs[event.job_id]
        job.consumers.add(event.consumer)
        if event.batch_rows:
            job.steps[event.consumer] = (event.start_step, event.batch_rows)

    def _job_created(self, event: JobCreated) -> None:
        key = JobKey(event.job_name, event.iteration)
        job = Job(
            event.job_id,
            key,
            event.snapshot,
            event.run_id,
            event.mode,
            event.num_splits,
            event.seed,
            # parallel_epochs streams whole epochs from every worker: nothing is leased, no split to track
            [SplitStatus() for _ in range(event.num_splits if event.mode == DISTRIBUTED else 0)],
            mixture=event.mixture,
        )
        self.jobs[job.job_id] = job
        self._by_key[key] = job.job_id

    def _job(self, job_id: int) -> Job:
        if job_id not in self.jobs:
            raise UsageError(f"unknown job {job_id}")
        return self.jobs[job_id]

    # -- splits ----------------------------------------------------------------------------
    def expire_leases(self, *, now: float) -> list[Event]:
        """Leases not renewed in time go back to pending (their consumer is presumed dead)."""
        return [
            self.apply(LeaseExpired(job.job_id, index))
            for job in self.jobs.values()
            for index in sorted(job.leased)
            if job.splits[index].lease_expiry < now
        ]

    def _lease_expired(self, event: LeaseExpired) -> None:
        job = self.jobs[event.job_id]
        job.set_split(event.split, SplitStatus(expired=True))
        job.tally.expired += 1

    def lease_split(
        self, job_id: int, consumer: str, *, now: float, index: int | None = None
    ) -> tuple[Lease, list[Event]]:
        """The split for ``consumer``'s assignment ``index`` (default: its next new one).

        A new assignment is the first pending split in split order (the seeded
        epoch order). An earlier index is a restored consumer re-reading what it
        was assigned: it gets the split again (re-leased if its lease expired
        and nobody took it), or ``taken_over`` when another consumer has it.
        """
        events = self.expire_leases(now=now)
        job = self._job(job_id)
        assigned = job.assignments.get(consumer, [])
        if index is not None and not 0 <= index <= len(assigned):
            raise UsageError(f"consumer {consumer} of job {job_id} has {len(assigned)} assignments, not {index + 1}")
        if index is not None and index < len(assigned):
            split = assigned[index]
            status = job.splits[split]
            if status.consumer not in ("", consumer):
                return Lease(split, False, index, taken_over=True), events
            if status.state is SplitState.PENDING:
                events.append(self._lease(job_id, split, consumer, now))
            return Lease(split, False, index, offset=job.starts.get((consumer, split), 0)), events
        mine = set(assigned)  # an expired split of a live consumer stays its own; others may take it over
        for split, status in enumerate(job.splits):
            if status.state is SplitState.PENDING and split not in mine:
                event = self._lease(job_id, split, consumer, now, assign=True)
                return Lease(split, False, len(job.assignments[consumer]) - 1, offset=event.offset), [*events, event]
        return Lease(None, job.finished), events

    def lease_splits(
        self, job_id: int, consumer: str, *, now: float, index: int, count: int
    ) -> tuple[list[Lease], bool, list[Event]]:
        """Up to ``count`` assignments from ``index`` (one round trip for a consumer's read-ahead).

        Returns the leases, whether the epoch is over, and the events. Fewer
        leases than asked means no split is pending for now.
        """
        leases: list[Lease] = []
        events: list[Event] = []
        for position in range(index, index + max(1, count)):
            lease, new_events = self.lease_split(job_id, consumer, now=now, index=position)
            events += new_events
            if lease.split is None:
                return leases, lease.end_of_epoch, events
            leases.append(lease)
        return leases, False, events

    def _lease(self, job_id: int, split: int, consumer: str, now: float, *, assign: bool = False) -> SplitLeased:
        """Leases (or renews) ``split``; ``assign`` also appends it to the consumer's assignments."""
        offset = self.jobs[job_id].offsets.get(split, 0) if assign else 0
        return self.apply(SplitLeased(job_id, split, consumer, now + self.lease_seconds, assign, offset))

    def _split_leased(self, event: SplitLeased) -> None:
        job = self.jobs[event.job_id]
        before = job.splits[event.split]
        if before.state is SplitState.PENDING:
            job.tally.leased += 1
            job.tally.released += before.expired
        job.set_split(event.split, SplitStatus(SplitState.LEASED, event.consumer, event.expiry))
        if event.assign:
            job.assignments.setdefault(event.consumer, []).append(event.split)
            job.holders[event.split] = event.consumer
            if event.offset:
                job.starts[(event.consumer, event.split)] = event.offset

    def renew(self, job_id: int, consumer: str, *, now: float) -> list[Event]:
        """Extends every lease ``consumer`` holds in the job (its heartbeat).

        Its assignments whose lease lapsed but that nobody took over are leased
        to it again: a heartbeat proves the consumer is alive and still has them.
        """
        job = self._job(job_id)
        mine = set(job.assignments.get(consumer, ()))
        return [
            self._lease(job_id, index, consumer, now)
            for index, split in enumerate(job.splits)
            if (split.state is SplitState.LEASED and split.consumer == consumer)
            or (split.state is SplitState.PENDING and index in mine)
        ]

    def ack_split(self, job_id: int, split: int, consumer: str) -> SplitAcked | None:
        """``consumer`` delivered every row of ``split``. Refused (UsageError) when another consumer has it.

        A late ack from a consumer whose lease expired and was re-leased is refused,
        so the rows are counted once: the new holder delivers them. An expired
        lease nobody took yet is still the consumer's to ack.
        """
        job = self._job(job_id)
        if not 0 <= split < job.num_splits:
            raise UsageError(f"job {job_id} has no split {split}")
        status = job.splits[split]
        if status.state is SplitState.DONE and status.consumer == consumer:
            return None
        if status.consumer not in ("", consumer) or split not in job.assignments.get(consumer, ()):
            raise UsageError(
                f"split {split} of job {job_id} is not leased to {consumer}; it was given to another consumer"
            )
        return self.apply(SplitAcked(job_id, split, consumer))

    def _split_acked(self, event: SplitAcked) -> None:
        job = self.jobs[event.job_id]
        job.tally.delivered += 1  # ``ack_split`` makes no event for a split already done
        job.set_split(event.split, SplitStatus(SplitState.DONE, event.consumer))
        job.offsets.pop(event.split, None)

    # -- restores ----------------------------------------------------------------------------
    def roll_back(self, job_id: int, requester: str, restore: Restore, *, now: float, rows_of) -> list[Event]:
        """Takes the job (and its later epochs) back to ``restore``, for ``requester`` (a restored consumer).

        ``rows_of(job)``: that job's ``split -> rows``. Refused (UsageError)
        when this dispatcher never heard of the state's consumer although it
        delivered rows (its ``--work_dir`` was lost, or another dispatcher);
        ``RollbackWait`` while a consumer of the job may still be reading.
        Returns the events (one ``rollback`` per job changed).
        """
        job = self._job(job_id)
        if restore.consumer not in job.assignments and (restore.next_index or restore.held):
            raise UsageError(
                f"the dispatcher has no record of consumer {restore.consumer} of job {job.key.job_name!r} epoch "
                f"{job.key.iteration}, whose state this is (its --work_dir was lost, or this is another dispatcher), "
                "so which rows that epoch delivered is unknown; restart the dispatcher with its --work_dir, or read "
                "the epoch anew under another job_name"
            )
        jobs = [
            later
            for later in self.jobs.values()
            if later.key.job_name == job.key.job_name and later.key.iteration >= job.key.iteration
        ]
        asked = self._restoring.setdefault(requester, now)
        plans = []
        for later in jobs:  # every job checked before any is changed (``RollbackWait``)
            rows = rows_of(later)
            taken_back = self._taken_back(later, later is job, requester, restore, (asked, now), rows)
            plans.append((later, rows, list(taken_back)))
        del self._restoring[requester]
        events: list[Event] = []
        for later, rows, delivered in plans:
            done, reopened = rollback.changes(delivered, later.holders.get, later.split_now, rows)
            if done or reopened:
                pairs = tuple(map(tuple, done)), tuple(map(tuple, reopened))
                events.append(self.apply(RolledBack(later.job_id, *pairs)))
        return events

    def _taken_back(self, job: Job, restored_epoch: bool, requester: str, restore: Restore, when, rows):
        """(consumer, split, rows delivered up to the checkpoint) for each consumer of ``job`` taken back."""
        if job.mode != DISTRIBUTED:
            return
        for consumer, assigned in job.assignments.items():
            if consumer == requester:
                continue
            starts = {split: start for (holder, split), start in job.starts.items() if holder == consumer}
            if consumer == restore.consumer and restored_epoch:
                delivered = rollback.by_cursor(assigned, starts, rows, restore)
            elif consumer == restore.consumer or self._gone(job, consumer, restored_epoch, restore, when):
                budget = 0
                if restored_epoch:
                    budget = rollback.step_budget(restore.step, *job.steps[consumer])
                delivered = rollback.by_steps(assigned, starts, rows, budget)
            else:
                continue
            yield from ((consumer, split, covered) for split, covered in delivered)

    def _gone(self, job: Job, consumer: str, restored_epoch: bool, restore: Restore, when) -> bool:
        """Whether a restore takes ``consumer`` (not the state's) back: gone, with the steps to say how far.

        ``when``: (when the restore was first asked for, now).
        """
        if restore.step is None or (restored_epoch and consumer not in job.steps):
            return False  # an older state takes back its own consumer only; an older consumer told no steps
        asked, now = when
        heard = self.seen.get(consumer, self._since)
        age = now - heard
        alive = rollback.liveness(heard, asked, now, self.lease_seconds)
        if alive == "unknown":
            raise RollbackWait(
                f"restoring job {job.key.job_name!r}: waiting up to {self.lease_seconds - age:.0f} s more for "
                f"consumer {consumer} (last heard from {age:.0f} s ago) to renew its leases or to be presumed gone "
                "(--lease_seconds) before taking the job back to the restored state"
            )
        return alive == "gone"

    def _rolled_back(self, event: RolledBack) -> None:
        job = self.jobs[event.job_id]
        for split, consumer in event.done:
            job.tally.delivered += job.splits[split].state is not SplitState.DONE
            job.set_split(split, SplitStatus(SplitState.DONE, consumer))
            job.offsets.pop(split, None)
        for split, offset in event.reopened:
            job.tally.taken_back += job.splits[split].state is SplitState.DONE
            job.set_split(split, SplitStatus())
            job.offsets.pop(split, None)
            if offset:
                job.offsets[split] = offset

    def streams_read(self, job_id: int, consumer: str) -> StreamsRead | None:
        """parallel_epochs: ``consumer`` read every worker's stream of the epoch to its end."""
        job = self._job(job_id)
        if job.mode != PARALLEL:
            raise UsageError(f"job {job_id} is {job.mode}: its consumers acknowledge splits instead")
        if consumer in job.streams_read:
            return None
        return self.apply(StreamsRead(job_id, consumer))

    def _streams_read(self, event: StreamsRead) -> None:
        job = self.jobs[event.job_id]
        job.consumers.add(event.consumer)  # journals written before joining was journaled
        job.streams_read.add(event.consumer)

    # -- journal ---------------------------------------------------------------------------
    def apply(self, event: _E) -> _E:
        """Applies one event, a new one or a journaled one (``replay``): the only way the jobs change. Returns it."""
        match event:
            case JobCreated():
                self._job_created(event)
            case ConsumerJoined():
                self._consumer_joined(event)
            case SplitLeased():
                self._split_leased(event)
            case LeaseExpired():
                self._lease_expired(event)
            case SplitAcked():
                self._split_acked(event)
            case RolledBack():
                self._rolled_back(event)
            case StreamsRead():
                self._streams_read(event)
            case _:
                raise TypeError(f"{event!r} is not a dispatcher event")
        return event

    @classmethod
    def replay(cls, events: Iterable[Event], *, now: float, **options) -> DispatchState:
        """The state after ``events``; leases restored get a fresh term from ``now`` so their holders can finish."""
        state = cls(**options)
        state._since = now
        for event in events:
            state.apply(event)
        for job in state.jobs.values():
            for split in job.splits:
                if split.state is SplitState.LEASED:
                    split.lease_expiry = now + state.lease_seconds
        return state

    def status(self, *, now: float) -> dict:
        """What ``python -m reader.service status`` prints."""
        return {
            "workers": self.live_workers(now=now),
            "jobs": [
                {
                    "job_id": job.job_id,
                    "job_name": job.key.job_name,
                    "iteration": job.key.iteration,
                    "snapshot": job.snapshot,
                    "run_id": job.run_id,
                    "mode": job.mode,
                    "splits": job.counts(),
                    "consumers": {consumer: _consumer_status(job, consumer) for consumer in sorted(job.consumers)},
                    "finished": job.finished,
                }
                for job in self.jobs.values()
            ],
        }


def _mixture_text(definition: str) -> str:
    """A job's mixture for a message: its weights and batch (the snapshots alone, for a snapshot's job)."""
    return MixtureJob.from_json(definition).description if definition else "its snapshots as they are (no mixture)"


def _consumer_status(job: Job, consumer: str) -> dict:
    if job.mode == PARALLEL:
        return {"streams_read": consumer in job.streams_read}
    return {
        "assigned": len(job.assignments.get(consumer, ())),
        "leased": sum(s.state is SplitState.LEASED and s.consumer == consumer for s in job.splits),
        "done": sum(s.state is SplitState.DONE and s.consumer == consumer for s in job.splits),
    }
