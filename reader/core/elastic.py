"""Elastic resume: what is left of an epoch, cut anew for other input pipelines. Pure logic, no I/O.

In synchronous training every input pipeline is at the same step, so the topology an epoch is cut
with (policy, pipelines, global batch, window) and the step it reached say exactly which rows of
that epoch all pipelines together delivered. What is left is a short list of *segments*
``(pipeline, start, stop)``: rows ``[start, stop)`` of that pipeline's epoch stream
(``reader.core.order.EpochOrder``) in the epoch's *base* streams, those of the pipelines the epoch
started on. A dataset restored on another topology reads that remainder once, as an epoch of its
own cut like AUTO (``remainder_cut``: equal contiguous shares; DATA: one shared stream sliced per
global batch; OFF: every pipeline reads all of it), then reads normal epochs of its own topology.

What is left of a remainder epoch is again segments of the same base streams, so after any number
of restores a state names at most as many segments as the pipelines of every topology it passed
through: its size grows with pipelines, never with blocks or rows.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from reader.core.plan import (
    InputContext,
    Position,
    ShardPolicy,
    StepPlan,
    assigned_pieces,
    pipeline_rows,
    plan_steps,
)

#: Rows ``[start, stop)`` of the epoch stream of base pipeline ``pipeline``: ``(pipeline, start, stop)``.
Segment = tuple[int, int, int]


def segment_rows(segments: Sequence[Segment]) -> int:
    return sum(stop - start for _, start, stop in segments)


def slice_segments(segments: Sequence[Segment], start: int, stop: int) -> tuple[Segment, ...]:
    """Rows ``[start, stop)`` of the concatenation of ``segments``, as segments."""
    selected, offset = [], 0
    for pipeline, first, end in segments:
        lo, hi = max(start, offset), min(stop, offset + end - first)
        if lo < hi:
            selected.append((pipeline, first + lo - offset, first + hi - offset))
        offset += end - first
        if offset >= stop:
            break
    return tuple(selected)


def _merged(segments: Sequence[Segment]) -> tuple[Segment, ...]:
    """Adjacent segments of one stream joined (a share cut at a segment's middle and not read yet)."""
    merged: list[Segment] = []
    for pipeline, start, stop in segments:
        if merged and merged[-1][0] == pipeline and merged[-1][2] == start:
            merged[-1] = (pipeline, merged[-1][1], stop)
        else:
            merged.append((pipeline, start, stop))
    return tuple(merged)


@dataclasses.dataclass(frozen=True)
class Streams:
    """The epoch streams that segments index: those of ``pipelines`` pipelines under ``policy`` with
    windows of ``window_rows`` (the seed and shuffle settings are the dataset's, which a state must match)."""

    policy: ShardPolicy
    pipelines: int
    window_rows: int

    def __post_init__(self) -> None:
        if self.pipelines == 1:  # one pipeline reads every block in stored order under any policy
            object.__setattr__(self, "policy", ShardPolicy.AUTO)

    @property
    def _context(self) -> InputContext:
        return InputContext(self.pipelines, 0, self.pipelines)

    def pieces(self, block_rows: Sequence[Sequence[int]]):
        """Every pipeline's pieces (``plan.assigned_pieces``)."""
        return assigned_pieces(block_rows, self.policy, self._context)

    def rows(self, block_rows: Sequence[Sequence[int]]) -> list[int]:
        """Every pipeline's stream rows (``plan.pipeline_rows``)."""
        return pipeline_rows(block_rows, self.policy, self._context)

    def to_json(self) -> dict:
        return {"policy": self.policy.value, "pipelines": self.pipelines, "window_rows": self.window_rows}

    @classmethod
    def from_json(cls, value: dict) -> Streams:
        return cls(ShardPolicy(value["policy"]), int(value["pipelines"]), int(value["window_rows"]))


@dataclasses.dataclass(frozen=True)
class Topology:
    """How an epoch is cut into steps: its streams and the global batch (replicas do not change which rows
    a step takes, only how it is split)."""

    streams: Streams
    global_batch: int
    drop_remainder: bool

    @property
    def pipelines(self) -> int:
        return self.streams.pipelines

    @property
    def shared(self) -> bool:
        """Every pipeline reads the same stream (DATA: each its slice of a global batch; OFF: all of it)."""
        return self.streams.policy in (ShardPolicy.DATA, ShardPolicy.OFF) and self.pipelines > 1

    def to_json(self) -> dict:
        return {**self.streams.to_json(), "global_batch": self.global_batch, "drop_remainder": self.drop_remainder}

    @classmethod
    def from_json(cls, value: dict) -> Topology:
        return cls(Streams.from_json(value), int(value["global_batch"]), bool(value["drop_remainder"]))


@dataclasses.dataclass(frozen=True)
class EpochCut:
    """One topology's cut of an epoch: each pipeline's stream, as segments of the base streams."""

    topology: Topology
    streams: tuple[tuple[Segment, ...], ...]

    @functools.cached_property
    def _rows(self) -> list[int]:
        return [segment_rows(stream) for stream in self.streams]

    def plan(self, pipeline: int) -> StepPlan:
        """How ``pipeline``'s stream is cut into steps (every pipeline takes the same number)."""
        topology = self.topology
        context = InputContext(topology.pipelines, pipeline, topology.pipelines)
        policy = topology.streams.policy
        return plan_steps(self._rows, topology.global_batch, policy, context, drop_remainder=topology.drop_remainder)

    def step_segments(self, pipeline: int, step: int) -> tuple[Segment, ...]:
        """The rows ``pipeline`` delivers at ``step``."""
        return slice_segments(self.streams[pipeline], *self.plan(pipeline).step_range(step))

    def left_after(self, steps: int | Sequence[int]) -> tuple[Segment, ...]:
        """The rows of the epoch no pipeline has delivered after ``steps`` steps (one copy of a shared stream);
        a sequence: each pipeline's own steps (DataLoader workers a step apart; not for a shared stream)."""
        each = [steps] * self.topology.pipelines if isinstance(steps, int) else steps
        left: list[Segment] = []
        for pipeline in range(1 if self.topology.shared else self.topology.pipelines):
            plan = self.plan(pipeline)
            left += slice_segments(self.streams[pipeline], plan.consumed(each[pipeline]), plan.stream_rows)
        return _merged(left)


def epoch_cut(topology: Topology, block_rows: Sequence[Sequence[int]]) -> EpochCut:
    """A normal epoch of ``topology``, its own base: each pipeline reads its whole stream."""
    streams = tuple(((p, 0, r),) if r else () for p, r in enumerate(topology.streams.rows(block_rows)))
    return EpochCut(topology, (streams[0],) * topology.pipelines if topology.shared else streams)


def remainder_cut(topology: Topology, segments: Sequence[Segment]) -> EpochCut:
    """A remainder epoch read by ``topology``: every pipeline all of it (shared), else an equal contiguous share."""
    if topology.shared:
        return EpochCut(topology, (tuple(segments),) * topology.pipelines)
    total, pipelines = segment_rows(segments), topology.pipelines
    return EpochCut(
        topology,
        tuple(slice_segments(segments, total * p // pipelines, total * (p + 1) // pipelines) for p in range(pipelines)),
    )


@dataclasses.dataclass(frozen=True)
class Remainder:
    """What is left of epoch ``epoch``: ``segments`` of the epoch streams of ``base``."""

    epoch: int
    base: Streams
    segments: tuple[Segment, ...]

    def to_json(self) -> dict:
        """Its fields in a state (whose ``epoch`` is the remainder's)."""
        return {"base": self.base.to_json(), "segments": [list(segment) for segment in self.segments]}

    @classmethod
    def from_json(cls, epoch: int, value: dict) -> Remainder:
        segments = tuple((int(p), int(start), int(stop)) for p, start, stop in value["segments"])
        return cls(epoch, Streams.from_json(value["base"]), segments)


def resume(
    position: Position,
    saved_by: Topology,
    remainder: Remainder | None,
    restored_by: Topology,
    block_rows: Sequence[Sequence[int]],
) -> tuple[Position, Remainder | None]:
    """Where a dataset cut as ``restored_by`` resumes a state saved at ``position`` by pipelines cut as
    ``saved_by`` (``remainder``: the epoch they were reading was one): the same position on the same
    topology; else the first step of what is left of the epoch, or of the next epoch when nothing is."""
    if remainder is not None and remainder.epoch != position.epoch:
        remainder = None
    if saved_by == restored_by:
        return position, remainder
    if remainder is None:
        if position.step == 0:
            return position, None  # the whole epoch is left: a normal epoch of the new topology
        cut, base = epoch_cut(saved_by, block_rows), saved_by.streams
    else:
        cut, base = remainder_cut(saved_by, remainder.segments), remainder.base
    left = cut.left_after(position.step)
    if not left:
        return Position(position.epoch + 1, 0), None
    return Position(position.epoch, 0), Remainder(position.epoch, base, left)


def steps_left(state: dict, block_rows: Sequence[Sequence[int]]) -> int:
    """Steps the pipeline whose (version 3, local) ``state`` this is still takes in the state's epoch: what
    is left of a normal epoch, or of the remainder epoch an elastic restore made (``get_state()`` of an
    iterator just restored: its topology is the new one). 0 once its last epoch is read."""
    stop_epoch = state["stop_epoch"]
    if state["finished"] or (stop_epoch is not None and state["epoch"] >= stop_epoch):
        return 0
    topology = Topology.from_json(state["topology"])
    if state["remainder"] is None:
        cut = epoch_cut(topology, block_rows)
    else:
        cut = remainder_cut(topology, Remainder.from_json(state["epoch"], state["remainder"]).segments)
    return cut.plan(state["pipeline"]).steps - state["step"]
