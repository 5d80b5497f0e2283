"""A resumable iterator: a background producer, a bounded queue, and a position.

The producer runs ``ReadPipeline.steps`` ahead of the consumer by at most
``prefetch`` steps; memory is bounded by options, not by the snapshot. The
position in ``get_state()`` is the consumer's (the next step it will receive),
never the producer's, so a restored iterator repeats nothing and skips nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from reader.core.background import BackgroundProducer, ProducedIterator
from reader.core.pipeline import ReadPipeline
from reader.core.plan import Position
from reader.core.state import LOCAL, StateEnvelope, rows_config
from reader.core.stats import ReaderClock

_FIELDS = ("seed", "epoch", "step", "stop_epoch", "finished")


def _envelope(pipeline: ReadPipeline) -> StateEnvelope:
    """What must match for a state to mean the same rows: options that change the order or the cut."""
    o = pipeline.options
    must_match = {
        **rows_config(pipeline.snapshot, o, pipeline.columns),
        "policy": o.shard_policy.value,
        "shuffle": [o.shuffle, o.reshuffle_each_epoch, pipeline.window_rows],
    }
    return StateEnvelope(LOCAL, must_match)


class ReaderIterator(ProducedIterator):
    """Iterates steps; ``get_state()``/``set_state()`` resume exactly (JSON-serializable)."""

    def __init__(
        self, pipeline: ReadPipeline, first_epoch: int, adapt: Callable[[list], Any], clock: ReaderClock | None = None
    ) -> None:
        self._pipeline = pipeline
        self._adapt = adapt
        self._clock = clock
        self._position = Position(first_epoch, 0)
        self._stop_epoch = pipeline.stop_epoch(first_epoch)
        self._seed = pipeline.seed
        self._envelope = _envelope(pipeline)

    def _new_producer(self) -> BackgroundProducer:
        pipeline, start, stop_epoch = self._pipeline.with_seed(self._seed), self._position, self._stop_epoch
        return BackgroundProducer(
            lambda: pipeline.steps(start, stop_epoch, self._clock), self._pipeline.options.prefetch, "snapfeed-prefetch"
        )

    def _received(self, item):
        self._position, batches = item
        return self._adapt(batches)

    @property
    def delivered_epoch(self) -> int:
        """The epoch of the step delivered last (the position is the next one's: the first of the next epoch
        once an epoch's last step is out)."""
        position = self._position
        return position.epoch if position.step else position.epoch - 1

    def get_state(self) -> dict:
        return self._envelope.seal(
            {
                "seed": self._seed,
                "epoch": self._position.epoch,
                "step": self._position.step,
                "stop_epoch": self._stop_epoch,
                "finished": self._finished,
            }
        )

    def set_state(self, state: dict) -> None:
        self._envelope.check(state, _FIELDS)
        self.close()
        self._seed = int(state["seed"])
        self._position = Position(int(state["epoch"]), int(state["step"]))
        self._stop_epoch = state["stop_epoch"]
        self._finished = bool(state["finished"])

    def close(self) -> None:
        """Stops the producer; idempotent. A later ``next`` restarts it from the current position."""
        self._stop_producer()
