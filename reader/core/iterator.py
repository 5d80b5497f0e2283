"""A resumable iterator: a background producer, a bounded queue, and a position.

The producer runs ``ReadPipeline.steps`` ahead of the consumer by at most
``prefetch`` steps (small steps cross in groups of up to ``GROUP_BYTES``, ``ReadPipeline.step_groups``,
``prefetch // group_steps`` groups queued); memory is bounded by options, not by the snapshot. The
position in ``get_state()`` is the consumer's (the next step it will receive),
never the producer's, so a restored iterator repeats nothing and skips nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from reader.core.background import BackgroundProducer, ProducedIterator
from reader.core.elastic import Remainder, Topology
from reader.core.mixture import refusal
from reader.core.pipeline import ReadPipeline
from reader.core.plan import Position, ShardPolicy
from reader.core.state import LOCAL, StateEnvelope, rows_config
from reader.core.stats import ReaderClock
from schemas.errors import UsageError

_FIELDS = ("seed", "epoch", "step", "stop_epoch", "finished")
#: Since version 3: what the state's rows are, and the topology its position counts in.
_V3_FIELDS = ("snapshot", "columns", "seed_shared", "topology", "pipeline", "remainder")


def _envelope(pipeline: ReadPipeline) -> StateEnvelope:
    """What must match for a state to mean the same rows: the snapshot run, the columns and the shuffle
    settings (the topology travels in the state; a version 1 or 2 state had it in its digest)."""
    o = pipeline.options
    same_rows = {
        "snapshot": pipeline.snapshot.identity,
        "columns": pipeline.columns,
        "shuffle": [o.shuffle, o.reshuffle_each_epoch],
    }
    before_v3 = {
        **rows_config(pipeline.snapshot, o, pipeline.columns),
        "policy": o.shard_policy.value,
        "shuffle": [o.shuffle, o.reshuffle_each_epoch, pipeline.window_rows],
    }
    return StateEnvelope(LOCAL, same_rows, before_v3)


def _refuse_other_rows(pipeline: ReadPipeline, state: dict) -> None:
    """One line naming what differs when a state was saved reading other rows than ``pipeline`` reads."""
    if refused := refusal(state["snapshot"], pipeline.snapshot):
        raise UsageError(refused)
    if state["columns"] != pipeline.columns:
        raise UsageError(
            f"this local reader state was saved reading columns {state['columns']}; this dataset reads "
            f"{pipeline.columns}: build it with columns={state['columns']!r} to restore it"
        )


class ReaderIterator(ProducedIterator):
    """Iterates steps; ``get_state()``/``set_state()`` resume exactly (JSON-serializable), also on other
    pipelines or another global batch (``reader.core.elastic``)."""

    def __init__(
        self, pipeline: ReadPipeline, first_epoch: int, adapt: Callable[[list], Any], clock: ReaderClock | None = None
    ) -> None:
        self._pending: collections.deque = collections.deque()  # received in a group, not delivered yet
        self._pipeline = pipeline
        self._adapt = adapt
        self._clock = clock
        self._position = Position(first_epoch, 0)
        self._stop_epoch = pipeline.stop_epoch(first_epoch)
        self._seed = pipeline.seed
        # Whether every pipeline reads with this seed: given by the user, or taken by all from one state.
        self._seed_shared = pipeline.options.seed is not None
        self._remainder: Remainder | None = None  # what an elastic restore left of an epoch, read first
        self._envelope = _envelope(pipeline)

    def _new_producer(self) -> BackgroundProducer:
        pipeline, start, stop_epoch = self._pipeline.with_seed(self._seed), self._position, self._stop_epoch
        remainder, clock = self._remainder, self._clock  # not ``self``: the thread must not keep this iterator alive
        return BackgroundProducer(
            lambda: pipeline.step_groups(start, stop_epoch, clock, remainder),
            max(1, self._pipeline.options.read.prefetch // pipeline.group_steps),
            "snapfeed-prefetch",
        )

    def __next__(self):
        if not self._pending:
            self._pending.extend(super().__next__())
        self._position, batches = self._pending.popleft()
        return self._adapt(batches)

    def _received(self, item):
        return item

    @property
    def delivered_epoch(self) -> int:
        """The epoch of the step delivered last (the position is the next one's: the first of the next epoch
        once an epoch's last step is out)."""
        position = self._position
        return position.epoch if position.step else position.epoch - 1

    def get_state(self) -> dict:
        remainder, pipeline = self._remainder, self._pipeline
        in_remainder = remainder is not None and remainder.epoch == self._position.epoch
        return self._envelope.seal(
            {
                "seed": self._seed,
                "epoch": self._position.epoch,
                "step": self._position.step,
                "stop_epoch": self._stop_epoch,
                "finished": self._finished,
                "snapshot": pipeline.snapshot.identity,
                "columns": pipeline.columns,
                "seed_shared": self._seed_shared,
                "topology": pipeline.topology.to_json(),
                "pipeline": pipeline.options.context.input_pipeline_id,
                "remainder": remainder.to_json() if in_remainder else None,
            }
        )

    def set_state(self, state: dict) -> None:
        """Resumes at ``state``: where it was on the same topology, else the rest of its epoch exactly once
        over this topology's pipelines (every pipeline restored from the same state takes its share).

        Args:
            state: what ``get_state()`` returned (after a JSON round trip, as saved with a checkpoint).
        """
        version = self._envelope.check_header(state, _FIELDS)
        if version >= 3:
            self._envelope.check_header(state, _FIELDS + _V3_FIELDS)
            _refuse_other_rows(self._pipeline, state)
        seed = int(state["seed"])
        if self._pipeline.options.seed is not None and self._pipeline.options.seed != seed:
            raise UsageError(
                f"this local reader state was saved with seed={seed}; this dataset was built with "
                f"seed={self._pipeline.options.seed}: build it with seed={seed} (or seed=None to take the state's)"
            )
        self._envelope.check_digest(state)
        position = Position(int(state["epoch"]), int(state["step"]))
        remainder, seed_shared = None, self._pipeline.options.seed is not None
        if version >= 3:
            position, remainder, seed_shared = self._resumed(state, position, seed_shared)
        self.close()
        self._seed, self._seed_shared = seed, seed_shared
        self._position, self._remainder = position, remainder
        self._stop_epoch = state["stop_epoch"]
        self._finished = bool(state["finished"])

    def _resumed(self, state: dict, position: Position, seed_shared: bool) -> tuple[Position, Remainder | None, bool]:
        """Where a version 3 state resumes on this pipeline, and whether its seed is then every pipeline's."""
        pipeline = self._pipeline
        saved_by, mine = Topology.from_json(state["topology"]), pipeline.topology
        saved = state["remainder"]
        remainder = None if saved is None else Remainder.from_json(position.epoch, saved)
        seed_shared = seed_shared or bool(state["seed_shared"]) or not pipeline.options.shuffle
        others_read = saved_by != mine or state["pipeline"] != pipeline.options.context.input_pipeline_id
        policy = saved_by.streams.policy
        if (
            others_read
            and not seed_shared
            and saved_by.pipelines > 1
            and policy in (ShardPolicy.AUTO, ShardPolicy.FILE)
        ):
            raise UsageError(
                f"this local reader state was saved by input pipeline {state['pipeline']} of {saved_by.pipelines} "
                f"with a seed it drew (seed=None), so it restores only that pipeline on the same topology; pass "
                f"the same seed=<int> to every pipeline so that one state restores them all"
            )
        position, remainder = pipeline.resume(position, saved_by, remainder)
        return position, remainder, seed_shared or saved_by != mine

    def steps_left_in_epoch(self) -> int:
        """Steps this pipeline still takes in the epoch it is at (0 once its last epoch is read)."""
        return self._pipeline.steps_left(self.get_state())

    def close(self) -> None:
        """Stops the producer; idempotent. A later ``next`` restarts it from the current position (the
        steps received but not delivered are dropped: they are read again)."""
        self._pending.clear()
        self._stop_producer()
