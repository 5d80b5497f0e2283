"""Which rows each input pipeline reads in an epoch, and how its steps are cut.

Pure logic over the manifest's block row counts: no I/O, no TensorFlow. Every
pipeline computes the same plan for all pipelines, so they agree on the number
of steps per epoch without talking to each other (synchronous training never
waits on a worker that ran out of data: short workers yield partial or empty
batches instead).

Policies (seed 003, docs/architecture.md §4.2):
- FILE: whole shards per pipeline, balanced by rows; fewer shards than
  pipelines is an error that names AUTO.
- AUTO: FILE at block granularity: the snapshot's rows in stored order are cut
  into equal contiguous ranges, so any number of pipelines works and row counts
  differ by at most one. The assignment does not depend on the seed, so workers
  that were not given a shared seed still read disjoint rows.
- DATA: every pipeline reads everything in the same order and keeps its slice
  of each global batch (needs a seed shared by all pipelines when shuffling).
- OFF: every pipeline reads everything, as if it were alone.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import itertools
import math
from collections.abc import Sequence

from schemas.errors import UsageError


class ShardPolicy(str, enum.Enum):
    AUTO = "AUTO"
    FILE = "FILE"
    DATA = "DATA"
    OFF = "OFF"

    @classmethod
    def parse(cls, value: str | ShardPolicy) -> ShardPolicy:
        if isinstance(value, cls):
            return value
        try:
            return cls(str(getattr(value, "name", value)).upper())
        except ValueError:
            raise UsageError(f"shard_policy={value!r}; choose one of AUTO, FILE, DATA, OFF") from None


@dataclasses.dataclass(frozen=True)
class InputContext:
    """Where this input pipeline sits in the job (mirrors ``tf.distribute.InputContext``).

    Args:
        num_input_pipelines: input pipelines of the whole job (one per process that reads, usually).
        input_pipeline_id: this pipeline's index, ``0 .. num_input_pipelines - 1``.
        num_replicas_in_sync: replicas of the whole job; each pipeline feeds ``num_replicas_in_sync /
            num_input_pipelines`` of them.
    """

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def __post_init__(self) -> None:
        if self.num_input_pipelines < 1 or self.num_replicas_in_sync < 1:
            raise UsageError(f"InputContext needs num_input_pipelines >= 1 and num_replicas_in_sync >= 1, got {self}")
        if not 0 <= self.input_pipeline_id < self.num_input_pipelines:
            raise UsageError(f"input_pipeline_id={self.input_pipeline_id} is outside 0..{self.num_input_pipelines - 1}")
        if self.num_replicas_in_sync % self.num_input_pipelines:
            raise UsageError(
                f"num_replicas_in_sync={self.num_replicas_in_sync} is not a multiple of "
                f"num_input_pipelines={self.num_input_pipelines}: every pipeline must feed the same number of replicas"
            )

    @property
    def replicas_per_pipeline(self) -> int:
        return self.num_replicas_in_sync // self.num_input_pipelines

    @classmethod
    def coerce(cls, context: object | None, *, num_replicas: int | None = None) -> InputContext:
        """Accepts ours, a ``tf.distribute.InputContext`` (duck-typed), or None (one pipeline)."""
        if context is None:
            return cls(num_replicas_in_sync=num_replicas or 1)
        if isinstance(context, cls):
            return context
        try:
            return cls(
                num_input_pipelines=int(context.num_input_pipelines),
                input_pipeline_id=int(context.input_pipeline_id),
                num_replicas_in_sync=int(context.num_replicas_in_sync),
            )
        except AttributeError:
            raise UsageError(
                f"input_context={context!r} is neither reader.InputContext nor tf.distribute.InputContext"
            ) from None


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of block ``block`` of shard ``shard``."""

    shard: int
    block: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def all_blocks(block_rows: Sequence[Sequence[int]]) -> list[Piece]:
    """Every non-empty block of the snapshot, in stored order."""
    return [
        Piece(shard, block, 0, rows)
        for shard, rows_of_blocks in enumerate(block_rows)
        for block, rows in enumerate(rows_of_blocks)
        if rows
    ]


def _cut_rows(pieces: Sequence[Piece], begin: int, end: int) -> list[Piece]:
    """The pieces covering rows ``[begin, end)`` of the concatenation of ``pieces``."""
    selected, offset = [], 0
    for piece in pieces:
        lo, hi = max(begin, offset), min(end, offset + piece.rows)
        if lo < hi and hi - lo == piece.rows:
            selected.append(piece)  # whole: most pieces of a large snapshot, so not made anew
        elif lo < hi:
            selected.append(Piece(piece.shard, piece.block, piece.start + lo - offset, piece.start + hi - offset))
        offset += piece.rows
        if offset >= end:
            break
    return selected


def _balanced_shards(shard_rows: Sequence[int], num_pipelines: int) -> list[list[int]]:
    """Largest shard first onto the least-loaded pipeline; deterministic on every worker."""
    loads = [0] * num_pipelines
    owned: list[list[int]] = [[] for _ in range(num_pipelines)]
    for shard in sorted(range(len(shard_rows)), key=lambda s: (-shard_rows[s], s)):
        target = min(range(num_pipelines), key=lambda p: (loads[p], p))
        owned[target].append(shard)
        loads[target] += shard_rows[shard]
    return [sorted(shards) for shards in owned]


def assigned_pieces(
    block_rows: Sequence[Sequence[int]], policy: ShardPolicy, context: InputContext
) -> list[list[Piece]]:
    """For every pipeline, the rows it reads each epoch, in stored order."""
    blocks = all_blocks(block_rows)
    workers = context.num_input_pipelines
    if policy in (ShardPolicy.DATA, ShardPolicy.OFF) or workers == 1:
        return [blocks] * workers
    if policy is ShardPolicy.FILE:
        if len(block_rows) < workers:
            raise UsageError(
                f"shard_policy=FILE needs at least one shard per input pipeline: the snapshot has "
                f"{len(block_rows)} shards for {workers} pipelines. Use shard_policy='AUTO' (block granularity) "
                f"or 'DATA', or materialize with a smaller --shard_size_bytes."
            )
        owned = _balanced_shards([sum(rows) for rows in block_rows], workers)
        return [[piece for piece in blocks if piece.shard in set(shards)] for shards in owned]
    starts = list(itertools.accumulate((piece.rows for piece in blocks), initial=0))  # of each block in the stream

    def cut(begin: int, end: int) -> list[Piece]:  # only the blocks in range are looked at: O(blocks) in all
        first = bisect.bisect_right(starts, begin) - 1
        return _cut_rows(blocks[first : bisect.bisect_left(starts, end)], begin - starts[first], end - starts[first])

    return [cut(starts[-1] * w // workers, starts[-1] * (w + 1) // workers) for w in range(workers)]


def pipeline_rows(block_rows: Sequence[Sequence[int]], policy: ShardPolicy, context: InputContext) -> list[int]:
    """Every pipeline's rows per epoch: what ``assigned_pieces`` gives each, without listing the pieces."""
    workers = context.num_input_pipelines
    shard_rows = [sum(rows) for rows in block_rows]
    total = sum(shard_rows)
    if policy in (ShardPolicy.DATA, ShardPolicy.OFF) or workers == 1:
        return [total] * workers
    if policy is ShardPolicy.FILE:
        return [sum(shard_rows[shard] for shard in shards) for shards in _balanced_shards(shard_rows, workers)]
    return [total * (w + 1) // workers - total * w // workers for w in range(workers)]


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """How one pipeline's epoch stream of rows is cut into steps.

    ``stream_rows`` rows flow through the pipeline each epoch; step ``k`` takes
    ``step_range(k)`` of them. With DATA the stream is the whole snapshot and a
    step is this pipeline's slice of the k-th global batch.
    """

    stream_rows: int
    pipeline_batch: int
    steps: int
    data_sliced: bool = False
    global_batch: int = 0
    slice_offset: int = 0

    def step_range(self, step: int) -> tuple[int, int]:
        if self.data_sliced:
            batch_start = step * self.global_batch
            batch_stop = min(batch_start + self.global_batch, self.stream_rows)
            start = min(batch_start + self.slice_offset, batch_stop)
            return start, min(start + self.pipeline_batch, batch_stop)
        start = min(step * self.pipeline_batch, self.stream_rows)
        return start, min(start + self.pipeline_batch, self.stream_rows)

    def consumed(self, steps: int) -> int:
        """How many rows of the stream are behind every pipeline after ``steps`` steps (with DATA: whole
        global batches, the slices of all pipelines)."""
        return min(steps * (self.global_batch if self.data_sliced else self.pipeline_batch), self.stream_rows)


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    """The next step to deliver: step ``step`` of epoch ``epoch`` (a pass starts at one and a saved state names one)."""

    epoch: int
    step: int

    def after(self, steps_per_epoch: int) -> Position:
        """The step after this one: the next epoch's first once this epoch's ``steps_per_epoch`` are done."""
        return Position(self.epoch, self.step + 1) if self.step + 1 < steps_per_epoch else Position(self.epoch + 1, 0)


def plan_steps(
    pipeline_rows: Sequence[int],
    global_batch_size: int,
    policy: ShardPolicy,
    context: InputContext,
    *,
    drop_remainder: bool,
) -> StepPlan:
    """The step plan of ``context.input_pipeline_id`` given every pipeline's row count."""
    if global_batch_size < 1:
        raise UsageError(f"global_batch_size={global_batch_size}; it must be at least 1")
    workers = context.num_input_pipelines
    if global_batch_size % workers:
        raise UsageError(
            f"global_batch_size={global_batch_size} is not divisible by the {workers} input pipelines; "
            f"every pipeline must contribute the same number of rows per step"
        )
    batch = global_batch_size // workers
    me = context.input_pipeline_id
    if policy is ShardPolicy.DATA and workers > 1:
        total = pipeline_rows[me]
        steps = total // global_batch_size if drop_remainder else math.ceil(total / global_batch_size)
        return StepPlan(total, batch, steps, data_sliced=True, global_batch=global_batch_size, slice_offset=me * batch)
    if drop_remainder:
        steps = min(rows // batch for rows in pipeline_rows)
    else:
        steps = max(math.ceil(rows / batch) for rows in pipeline_rows)
    return StepPlan(pipeline_rows[me], batch, steps)


def replica_ranges(num_rows: int, num_replicas: int) -> list[tuple[int, int]]:
    """Splits one step's rows across local replicas in order (seed 003).

    Each replica gets ``ceil(rows / replicas)``; surplus replicas get empty
    batches, so a partial step still yields one batch per replica.
    """
    per_replica = math.ceil(num_rows / num_replicas) if num_rows else 0
    return [(min(r * per_replica, num_rows), min((r + 1) * per_replica, num_rows)) for r in range(num_replicas)]
