"""The read pipeline of a mixture, and ``open_pipeline``: the pipeline of anything the reader reads.

A ``MixturePipeline`` is a ``ReadPipeline`` whose epoch stream is the mixture's
(``reader.core.mixture``): its windows come from a ``MixtureOrder`` instead of an ``EpochOrder``, and
everything else (the window loader and ring, the gatherer, the pools, the block reader and its cache,
per-replica batches, every output) is the snapshot pipeline's. Several pipelines slice one global
stream, each its part of every global batch (as ``shard_policy=DATA`` does; ``OFF``: each reads all
of it alone), so a state restores exactly on any number of pipelines with the same global batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from reader.core import allocator
from reader.core.elastic import Remainder, Streams, Topology
from reader.core.mixture import Mixture, MixtureOrder
from reader.core.mixture_plan import MixturePlan
from reader.core.options import ReaderOptions
from reader.core.pipeline import ReadPipeline
from reader.core.plan import Piece, Position, ShardPolicy, StepPlan, plan_steps
from reader.core.union import Readable
from schemas.errors import UsageError


def open_pipeline(
    snapshot: Readable | Mixture,
    options: ReaderOptions,
    allocate_batch: allocator.BatchAllocator = allocator.new_batch,
) -> ReadPipeline:
    """The read pipeline of a snapshot, a union or a mixture."""
    pipeline = MixturePipeline if isinstance(snapshot, Mixture) else ReadPipeline
    return pipeline(snapshot, options, allocate_batch)


class MixturePipeline(ReadPipeline):
    """One input pipeline over a mixture: its slice of every global batch of the mixture's one stream."""

    snapshot: Mixture

    def _plan(self, snapshot: Mixture, options: ReaderOptions) -> tuple[list[Piece], StepPlan]:
        context = options.context
        pipelines = context.num_input_pipelines
        self.sliced = pipelines > 1 and options.shard_policy is not ShardPolicy.OFF
        if self.sliced and options.shuffle and options.seed is None:
            raise UsageError(
                f"{snapshot.path} read by {pipelines} input pipelines with shuffle=True needs the same seed on "
                f"every pipeline (they slice one shuffled stream): pass seed=<int>"
            )
        batch = options.global_batch_size if self.sliced else options.global_batch_size // pipelines
        self.mixture_plan: MixturePlan = snapshot.plan(max(1, batch), options.drop_remainder)
        rows = self.mixture_plan.delivered_rows  # whole batches only, with drop_remainder
        policy = ShardPolicy.DATA if self.sliced else ShardPolicy.OFF
        # (which also refuses a global batch that is not a whole number of rows per pipeline)
        step_plan = plan_steps([rows] * pipelines, options.global_batch_size, policy, context, drop_remainder=False)
        return [piece for pieces in snapshot.source_pieces for piece in pieces], step_plan

    @property
    def batches_per_window(self) -> int:
        """Whole batches of the stratified stream per window: as many as fill the shuffle window."""
        return max(1, math.ceil(self.window_rows / self.mixture_plan.batch))

    def _largest_window(self) -> int:
        return self.batches_per_window * self.mixture_plan.batch

    @property
    def topology(self) -> Topology:
        o = self.options
        policy = ShardPolicy.DATA if self.sliced else ShardPolicy.OFF
        return Topology(
            Streams(policy, o.context.num_input_pipelines, self.window_rows), o.global_batch_size, o.drop_remainder
        )

    def epoch_order(self, pieces: Sequence[Piece] | None = None, window_rows: int | None = None) -> MixtureOrder:
        if pieces is not None or window_rows is not None:
            raise UsageError(f"{self.snapshot.path}: a mixture has no elastic remainder to read")
        own = self._own_order
        if own is not None and own.seed == self.seed:
            return own
        self._own_order = MixtureOrder(
            self.snapshot,
            self.mixture_plan,
            self.batches_per_window,
            self.seed,
            shuffle=self.options.shuffle,
            reshuffle_each_epoch=self.options.reshuffle_each_epoch,
        )
        return self._own_order

    def _stream_batch(self, topology: Topology) -> int:
        """The batch a topology's stream is stratified on (OFF with several pipelines: each pipeline's own)."""
        off = topology.streams.policy is ShardPolicy.OFF and topology.pipelines > 1
        return topology.global_batch // topology.pipelines if off else topology.global_batch

    def resume(
        self, position: Position, saved_by: Topology, remainder: Remainder | None
    ) -> tuple[Position, Remainder | None]:
        """The same position when the saved stream is this one's (the same batch and windows, any number of
        pipelines), or at an epoch's start; else one line: the rows of the epoch's later batches depend on them."""
        mine = self.topology
        same = (self._stream_batch(saved_by), saved_by.drop_remainder, saved_by.streams.window_rows) == (
            self._stream_batch(mine),
            mine.drop_remainder,
            mine.streams.window_rows,
        )
        if same or position.step == 0:
            return position, None
        raise UsageError(
            f"this reader state was saved at step {position.step} of an epoch of {self.snapshot.path} read in "
            f"batches of {self._stream_batch(saved_by)} rows (windows of {saved_by.streams.window_rows} rows, "
            f"drop_remainder={saved_by.drop_remainder}); this dataset reads it in batches of "
            f"{self._stream_batch(mine)} (windows of {mine.streams.window_rows}, drop_remainder={mine.drop_remainder}): "
            f"a mixture resumes mid-epoch on any number of pipelines with the same global_batch_size and "
            f"shuffle_buffer_size; rebuild it with those, or restore a state saved at an epoch's start"
        )

    def steps_left(self, state: dict) -> int:
        stop_epoch = state["stop_epoch"]
        if state["finished"] or (stop_epoch is not None and state["epoch"] >= stop_epoch):
            return 0
        return self.steps_per_epoch - state["step"]
