"""The last stage: steps converted and placed on the accelerator ahead of the training step.

Input pipelines lose accelerator time when the host-to-device copy of step
``k + 1`` starts only after step ``k`` returned. ``DevicePrefetcher`` runs the
conversion (``transfer``: e.g. assembling a sharded ``jax.Array``, or pinned
``non_blocking`` copies to a CUDA device) on its own thread, ``depth`` steps
ahead of the consumer, so copies overlap the step; memory stays bounded at
``depth`` steps on the device plus the reader's own prefetch on the host.

It wraps any resumable step iterator (the local reader's or the service's):
``get_state()`` is the position of the next step the *consumer* receives, so
steps held on the device and not yet consumed are read again after a restore,
never skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from reader.core.background import BackgroundProducer, ProducedIterator


class StepIterator(Protocol):
    """A resumable iterator of host steps (``ReaderIterator``, ``ServiceIterator``)."""

    def __next__(self) -> Any: ...

    @property
    def delivered_epoch(self) -> int:
        """The epoch of the step delivered last."""
        ...

    def get_state(self) -> dict: ...

    def set_state(self, state: dict) -> None: ...

    def close(self) -> None: ...


def _as_is(step: Any) -> Any:
    return step


def _transferred(steps: StepIterator, transfer: Callable[[Any], Any]):
    for step in steps:
        # The inner iterator's state right after this step: where a consumer that received it resumes.
        yield steps.get_state(), steps.delivered_epoch, transfer(step)


class DevicePrefetcher(ProducedIterator):
    """Iterates ``transfer(step)`` for the steps of ``steps``, ``depth`` of them made ahead.

    ``deliver`` runs on the consumer's thread as each step is handed over, for
    what must happen there (e.g. making the consumer's CUDA stream wait for the
    copy made on the prefetch thread's stream).
    """

    def __init__(
        self,
        steps: StepIterator,
        transfer: Callable[[Any], Any],
        depth: int,
        deliver: Callable[[Any], Any] = _as_is,
    ) -> None:
        self._steps = steps
        self._transfer = transfer
        self._deliver = deliver
        self._depth = depth
        self._state = steps.get_state()  # the consumer's position: the next step it receives
        self.delivered_epoch: int | None = None  # the epoch of the step delivered last

    def _new_producer(self) -> BackgroundProducer:
        steps, transfer = self._steps, self._transfer  # not ``self``: the thread must not keep this iterator alive
        return BackgroundProducer(lambda: _transferred(steps, transfer), self._depth, "snapfeed-device-prefetch")

    def _received(self, item):
        self._state, self.delivered_epoch, step = item
        return self._deliver(step)

    def _ended(self) -> None:
        self._state = self._steps.get_state()  # the producer is done with the inner iterator: it says finished

    def get_state(self) -> dict:
        return self._state

    def set_state(self, state: dict) -> None:
        """Drops the steps made ahead and resumes the inner iterator at ``state``."""
        self.close()
        self._steps.set_state(state)
        self._state = self._steps.get_state()
        self._finished = bool(self._state.get("finished", False))

    def close(self) -> None:
        """Stops the prefetch thread and the inner iterator; a later ``next`` resumes at ``get_state()``."""
        if self._stop_producer():
            # The inner iterator ran ahead of the consumer; rewind it to the consumer's position.
            self._steps.set_state(self._state)
        self._steps.close()
