"""A mixture as the reader service serves it: its definition in job requests and tickets, and its splits (pure).

A mixture job (``reader.mixture(...)`` read with ``service=``) sends its sources' snapshots in the
one-snapshot fields, as a union's members (``protocol.members``), and ``MixtureJob`` as JSON beside them: the
sources' names, weights and member counts, the epoch's rows, and the batch the plan is stratified on. A split
is one window of the mixture's epoch stream (``reader.core.mixture.MixtureOrder``): a whole number of the
consumer's batches, each carrying every source within one row of weight x batch, streamed in the window's row
order. So the dispatcher only counts windows (their rows depend on the plan, never on the seed), a worker
turns ``(sources, definition, seed, epoch, split)`` into rows itself, and an epoch delivers exactly each
source's share whichever consumers lease which windows. Each consumer's batches are the plan's batches:
windows end on batch boundaries, so a consumer's batcher is empty between them (the epoch's partial batch
aside).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator, Sequence

import numpy as np

from reader.core.mixture import Mixture, MixtureOrder, MixtureWindow, weights_text
from reader.core.mixture_plan import MixturePlan
from reader.core.snapshot import Snapshot
from reader.core.union import SnapshotUnion
from schemas.errors import UsageError


@dataclasses.dataclass(frozen=True)
class MixtureJob:
    """What a mixture job's servers need beside its sources' snapshots to compute its splits and their rows."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    #: How many of the snapshots sent each source has, in order (a source may be a union or a view).
    member_counts: tuple[int, ...]
    epoch_rows: int
    #: The batch every window is a whole number of, and each stratified on: the consumer's (per-pipeline) batch.
    batch: int
    batches_per_window: int
    drop_remainder: bool

    @classmethod
    def of(cls, mixture: Mixture, batch: int, window_rows: int, drop_remainder: bool) -> MixtureJob:
        """``mixture`` read in batches of ``batch`` rows, in windows of whole batches holding ``window_rows`` rows
        or a little more: the local reader's windows for the same options (``pipeline.window_rows``), so a
        consumer reading a job alone gets the very batches the local reader gives."""
        counts = tuple(len(source.members) if isinstance(source, SnapshotUnion) else 1 for source in mixture.sources)
        return cls(
            mixture.names,
            mixture.weights,
            counts,
            mixture.epoch_rows,
            batch,
            max(1, math.ceil(window_rows / batch)),
            drop_remainder,
        )

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> MixtureJob:
        """The definition a consumer sent; ``UsageError`` in one line when it is not one."""
        try:
            fields = json.loads(text)
            job = cls(
                tuple(str(name) for name in fields["names"]),
                tuple(float(weight) for weight in fields["weights"]),
                tuple(int(count) for count in fields["member_counts"]),
                int(fields["epoch_rows"]),
                int(fields["batch"]),
                int(fields["batches_per_window"]),
                bool(fields["drop_remainder"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"malformed mixture definition ({exc}): {text[:200]!r}") from None
        sizes_agree = len(job.names) == len(job.weights) == len(job.member_counts) > 0
        if not sizes_agree or min(job.member_counts) < 1 or min(job.weights) <= 0:
            raise UsageError(f"malformed mixture definition (sources, weights and counts disagree): {text[:200]!r}")
        if job.epoch_rows < 1 or job.batch < 1 or job.batches_per_window < 1:
            raise UsageError(f"malformed mixture definition (rows, batch or window below 1): {text[:200]!r}")
        return job

    @property
    def description(self) -> str:
        """For messages: ``the mixture web=3,code=1 in batches of 64 rows``."""
        return f"the mixture {weights_text(self.names, self.weights)} in batches of {self.batch} rows"

    def mixture(self, opened: Snapshot | SnapshotUnion) -> Mixture:
        """The mixture of the snapshots sent (``runs.open_run``), each source its ``member_counts`` of them."""
        members = opened.members if isinstance(opened, SnapshotUnion) else (opened,)
        if sum(self.member_counts) != len(members):
            raise UsageError(
                f"a mixture of {sum(self.member_counts)} snapshots was sent with {len(members)}: send each "
                f"source's snapshots"
            )
        sources, first = [], 0
        for count in self.member_counts:
            part = members[first : first + count]
            sources.append(part[0] if count == 1 else SnapshotUnion(tuple(part)))
            first += count
        return Mixture(self.names, tuple(sources), self.weights, self.epoch_rows)

    def plan(self, mixture: Mixture) -> MixturePlan:
        return mixture.plan(self.batch, self.drop_remainder)

    def split_rows(self, mixture: Mixture) -> np.ndarray:
        """Rows of each split (window) of every epoch: the plan's, the same whatever the seed."""
        return self.plan(mixture).window_quotas(self.batches_per_window).sum(axis=1).astype(np.int64)

    def order(self, mixture: Mixture, seed: int) -> MixtureOrder:
        """The windows of the job's epochs by ``seed`` (the job's; a parallel_epochs worker's own)."""
        return MixtureOrder(mixture, self.plan(mixture), self.batches_per_window, seed)


class MixtureSplits:
    """A mixture job's splits as a consumer counts them: what ``splits.JobOrder`` is to a snapshot's job."""

    def __init__(self, rows: Sequence[int]) -> None:
        self._rows = [int(count) for count in rows]

    def split_count(self) -> int:
        return len(self._rows)

    def split_rows(self, split: int) -> int:
        return self._rows[split]


def windows_from(windows: Sequence[MixtureWindow], offset: int) -> Iterator[tuple[MixtureWindow, int]]:
    """parallel_epochs: a worker's whole epoch of ``windows`` after its first ``offset`` rows, each window with
    the rows of it already delivered."""
    for window in windows:
        if offset >= window.rows:
            offset -= window.rows
            continue
        yield window, offset
        offset = 0
