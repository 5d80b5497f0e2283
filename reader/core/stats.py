"""How long a training loop waited for its input: the numbers that say whether a slow step is the input or the model.

A consumer's time splits into two: inside ``next()``, waiting for the next
step (the input's share), and between ``next()`` calls, doing the step (the
model's, and whatever else the loop does). ``StepClock`` keeps both, with the
rows and bytes of the steps delivered, on the consumer's own thread; no
profiler, two clock reads a step. ``InputStats`` is what ``iterator.stats()``
returns: a frozen value whose ``str`` a person can read.

Where the reader's own time went is kept apart (``ReaderClock``): its threads'
busy seconds per stage (storage reads, decode, gather, receiving from the
service's workers, conversion and device copies), timed around each task the
pipeline gives its pools and around each step's gather and conversion, never
per row. Busy seconds add up over threads, so they can exceed the loop's time;
the stage with the most is the one a faster reader must cut.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator

from reader.core.allocator import Columns

log = logging.getLogger("reader")


@dataclasses.dataclass(frozen=True)
class ReaderSeconds:
    """The busy seconds of the reader's own threads per stage, summed over threads.

    ``storage_reads``: reading shard bytes from disk or a bucket (the I/O threads);
    ``decode``: decompressing and decoding blocks into windows, and their shuffled
    row order; ``gather``: writing each step's rows into its batch (with large
    rows, reading them straight from their shards); ``receive``: a service
    consumer reading its workers' streams and rebatching them, waiting on the
    workers included; ``convert``: the output framework's conversion, ``map_fn``
    and device copies.
    """

    storage_reads: float = 0.0
    decode: float = 0.0
    gather: float = 0.0
    receive: float = 0.0
    convert: float = 0.0

    def minus(self, earlier: ReaderSeconds) -> ReaderSeconds:
        return ReaderSeconds(*(now - then for now, then in zip(_values(self), _values(earlier), strict=True)))

    def __str__(self) -> str:
        busy = [(stage, seconds) for stage, seconds in dataclasses.asdict(self).items() if seconds > 0]
        return ", ".join(f"{stage.replace('_', ' ')} {seconds:.2f} s" for stage, seconds in busy)


STAGES = tuple(field.name for field in dataclasses.fields(ReaderSeconds))


def _values(stats) -> list:
    return [getattr(stats, field.name) for field in dataclasses.fields(stats)]


@dataclasses.dataclass(frozen=True)
class InputStats:
    """What an iterator delivered and how long its consumer waited for it.

    ``wait_seconds``: inside ``next()``; ``elsewhere_seconds``: between one
    step's delivery and the next ``next()`` (the training step's own time).
    ``seconds`` runs from the first ``next()`` to the last delivery or call.
    ``reader``: where the reader's own threads spent their time meanwhile.
    """

    steps: int = 0
    rows: int = 0
    bytes: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0
    elsewhere_seconds: float = 0.0
    reader: ReaderSeconds = ReaderSeconds()

    def minus(self, earlier: InputStats) -> InputStats:
        """What was delivered and waited for since ``earlier``: one epoch's, say.

        Args:
            earlier: this iterator's stats at an earlier moment.
        """
        counts = [now - then for now, then in zip(_values(self)[:-1], _values(earlier)[:-1], strict=True)]
        return InputStats(*counts, reader=self.reader.minus(earlier.reader))  # reader: the last field

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def bytes_per_second(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def input_bound_fraction(self) -> float:
        """The share of the loop's time spent waiting for input: near 0, the model is the bottleneck; near 1,
        the input is."""
        total = self.wait_seconds + self.elsewhere_seconds
        return self.wait_seconds / total if total > 0 else 0.0

    def __str__(self) -> str:
        busy = self.reader != ReaderSeconds()
        return (
            f"{self.steps} steps, {self.rows} rows ({self.bytes / 1e6:.1f} MB) in {self.seconds:.1f} s: "
            f"{self.rows_per_second:.0f} rows/s, {self.bytes_per_second / 1e6:.1f} MB/s; waited "
            f"{self.wait_seconds:.2f} s for input, {self.elsewhere_seconds:.2f} s elsewhere: "
            f"{self.input_bound_fraction:.0%} input-bound" + (f"; reader busy: {self.reader}" if busy else "")
        )


#: A step's gather and conversion are timed on one step in this many (the first included) and scaled to the
#: steps taken: timing every step cost 0.4 us a step for each, 0.4% of a read of 100-byte rows together.
SAMPLE_EVERY = 8


class SampledStage:
    """The time of one stage's per-step work, on one thread at a time: ``steps`` taken, ``sampled`` of them
    timed (one in ``SAMPLE_EVERY``), adding up to ``seconds``. Callers count and time inline (attributes, not
    calls: on 100-byte rows every step's 100 nanoseconds count)::

        stage.steps += 1
        if (stage.steps - 1) % SAMPLE_EVERY: ...untimed...
        else: ...timed, then stage.seconds += elapsed; stage.sampled += 1
    """

    __slots__ = ("steps", "sampled", "seconds")

    def __init__(self) -> None:
        self.steps = self.sampled = 0
        self.seconds = 0.0

    @property
    def estimate(self) -> float:
        """The stage's seconds over all its steps, scaled from those timed."""
        return self.seconds * self.steps / self.sampled if self.sampled else 0.0


class _StepStages:
    """A ``SampledStage`` per stage."""

    __slots__ = STAGES

    def __init__(self) -> None:
        for stage in STAGES:
            setattr(self, stage, SampledStage())


class ReaderClock:
    """Accumulates ``ReaderSeconds`` from the threads of one iterator's reader.

    Pool tasks, run on any thread, add under a lock (``add``, ``run``), once per
    task. A step's own work (its gather, its conversion) is done by one thread
    at a time per stage, so it is counted in ``steps.<stage>`` (a ``SampledStage``)
    without one.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks = dict.fromkeys(STAGES, 0.0)
        self.steps = _StepStages()

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self._tasks[stage] += seconds

    def run(self, stage: str, fn: Callable, /, *args, **kwargs):
        """``fn(*args, **kwargs)``, its time counted to ``stage``."""
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.add(stage, time.perf_counter() - started)

    def seconds(self) -> ReaderSeconds:
        with self._lock:
            return ReaderSeconds(
                **{stage: self._tasks[stage] + getattr(self.steps, stage).estimate for stage in STAGES}
            )


class TimedPool(concurrent.futures.Executor):
    """A view of a thread pool whose tasks' time counts to one stage of a ``ReaderClock`` (``map`` comes from
    ``Executor``, through ``submit``); the pool itself is shut down by its owner."""

    def __init__(self, pool: concurrent.futures.Executor, clock: ReaderClock, stage: str) -> None:
        self._pool = pool
        self._clock = clock
        self._stage = stage

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        return self._pool.submit(self._clock.run, self._stage, fn, *args, **kwargs)

    def run_here(self, fn, /, *args, **kwargs):
        """A task run on the caller's thread instead of the pool's, timed as the pool's are."""
        return self._clock.run(self._stage, fn, *args, **kwargs)


class StepClock:
    """Accumulates ``InputStats`` around a consumer's ``next()`` calls; used on one thread. Plain counters:
    a few hundred nanoseconds a step, against the tens of microseconds the smallest steps take. ``reader``
    is the ``ReaderClock`` the iterator's reader threads count their time in."""

    def __init__(self, clock=time.perf_counter) -> None:
        self.reader = ReaderClock()
        self._clock = clock
        self._started: float | None = None
        self._last: float | None = None  # when the previous step was delivered (None: not stepping)
        self._latest = 0.0  # the latest delivery or end
        self._steps = self._rows = self._bytes = 0
        self._wait = self._elsewhere = 0.0

    def waiting(self) -> float:
        """Marks the start of a ``next()`` call; the time since the previous delivery was spent elsewhere."""
        now = self._clock()
        if self._started is None:
            self._started = now
        if self._last is not None:
            self._elsewhere += now - self._last
        return now

    def delivered(self, since: float, rows: int, num_bytes: int) -> None:
        """A step of ``rows`` rows and ``num_bytes`` bytes handed over, waited for since ``since``."""
        self._last = self._latest = now = self._clock()
        self._wait += now - since
        self._steps += 1
        self._rows += rows
        self._bytes += num_bytes

    def ended(self, since: float) -> None:
        """A ``next()`` that found the end (or raised): its wait counts, and the loop is no longer stepping."""
        self._latest = now = self._clock()
        self._wait += now - since
        self._last = None

    def stats(self) -> InputStats:
        return InputStats(
            steps=self._steps,
            rows=self._rows,
            bytes=self._bytes,
            seconds=self._latest - self._started if self._started is not None else 0.0,
            wait_seconds=self._wait,
            elsewhere_seconds=self._elsewhere,
            reader=self.reader.seconds(),
        )


def step_size(batches: list[Columns]) -> tuple[int, int]:
    """Rows and bytes of one step's host batches (a batch per replica). Plain loops: on the smallest steps
    (1024 rows of 100 B, about 200 us) the generator expressions they replace cost 1% of the read."""
    rows = num_bytes = 0
    for batch in batches:
        values = None
        for values in batch.values():
            num_bytes += values.nbytes
        if values is not None:
            rows += len(values)
    return rows, num_bytes


def sized(
    convert: Callable[[list[Columns]], object], sizes: collections.deque, clock: ReaderClock
) -> Callable[[list[Columns]], object]:
    """``convert``, noting each step's rows and bytes in ``sizes`` first (in order, on whichever thread converts)
    and its time in ``clock`` (sampled)."""
    stage = clock.steps.convert

    def convert_sized(batches: list[Columns]) -> object:
        sizes.append(step_size(batches))
        stage.steps += 1
        if (stage.steps - 1) % SAMPLE_EVERY:
            return convert(batches)
        started = time.perf_counter()
        step = convert(batches)
        stage.seconds += time.perf_counter() - started
        stage.sampled += 1
        return step

    if hasattr(convert, "deliver"):  # what the device prefetcher asks of a conversion (torch_output)
        convert_sized.deliver = convert.deliver
    return convert_sized


class MeasuredIterator:
    """A dataset's iterator (the local reader's, the service's or the device prefetcher's) with a ``StepClock``
    around its ``next()``: ``stats()`` says how long the loop waited for input. Each step's rows and bytes come
    from ``sizes``, which ``sized`` fills as the steps are converted, maybe ahead on a prefetch thread; steps
    converted but never delivered (a ``close`` or ``set_state``) are forgotten with them."""

    def __init__(self, iterator: Iterator, sizes: collections.deque, clock: StepClock) -> None:
        self._iterator = iterator
        self._sizes = sizes
        self._clock = clock
        self._epoch: int | None = None  # the epoch of the step delivered last
        self._epoch_began = InputStats()  # the stats when that epoch's first step was asked for

    def __iter__(self) -> MeasuredIterator:
        return self

    def __next__(self):
        since = self._clock.waiting()
        try:
            step = next(self._iterator)
        except StopIteration:
            self._clock.ended(since)
            self._log_epoch()
            raise
        except BaseException:
            self._clock.ended(since)
            raise
        epoch = self._iterator.delivered_epoch
        if epoch != self._epoch:
            if self._epoch is not None:
                self._log_epoch()  # before this step, the next epoch's first, counts
            self._epoch = epoch
        rows, num_bytes = self._sizes.popleft() if self._sizes else (0, 0)
        self._clock.delivered(since, rows, num_bytes)
        return step

    def _log_epoch(self) -> None:
        """One INFO line for the epoch that just ended (or the pass, when it delivered nothing)."""
        stats = self._clock.stats()
        label = "" if self._epoch is None else f", epoch {self._epoch}"
        log.info("snapfeed input%s: %s", label, stats.minus(self._epoch_began))
        self._epoch_began = stats

    def stats(self) -> InputStats:
        """What this iterator delivered so far, how long its consumer waited for it, and where the reader's
        own time went."""
        return self._clock.stats()

    def get_state(self) -> dict:
        return self._iterator.get_state()

    def set_state(self, state: dict) -> None:
        self._iterator.set_state(state)
        self._sizes.clear()
        self._epoch, self._epoch_began = None, self._clock.stats()  # the restored epoch's line counts from here

    def close(self) -> None:
        self._iterator.close()
        self._sizes.clear()
