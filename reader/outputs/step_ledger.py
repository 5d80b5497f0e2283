"""The reader position of the steps a training loop received, when tf.data reads ahead of the loop.

``tf.data.Dataset.from_generator`` (``DistributedDataset.as_tf_dataset``) pulls steps from our iterator
ahead of the loop (tf.data's prefetch, tf.distribute's per-replica buffers), so the iterator's own
``get_state()`` is where the *reading* is, steps ahead of the training. The ledger keeps, for each step
a stream (one iteration of the tf.data dataset) produced, the reader state after it; the loop says how
many steps it received (``TFSteps``'s iterator, or the Keras callback after each batch), and the state of
that step is the one to checkpoint. A state to restore waits here until the next stream starts, which
restores it into its fresh iterator before reading. Pure Python, no TensorFlow.

In synchronous training every input pipeline of a worker is at the same step, so with several pipelines
in one process (``experimental_replication_mode=PER_REPLICA``) the lowest pipeline's states are kept.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

from schemas.errors import UsageError

#: States kept ahead of the loop at most; tf.data's buffers hold far fewer steps.
_MAX_AHEAD = 4096


@dataclasses.dataclass
class Stream:
    """One iteration's steps as produced: the state after each (``states[k]``: after its first k steps)."""

    generation: int
    states: collections.OrderedDict = dataclasses.field(default_factory=collections.OrderedDict)


class StepLedger:
    """States of produced steps, and the count of those the loop received, for one process's pipelines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active = False  # states are recorded only once something will ask for them
        self._generation = 0
        self._streams: dict[int, Stream] = {}
        self._received = 0
        self._pending: dict | None = None

    @property
    def pending(self) -> dict | None:
        """The state the next iteration will be restored to."""
        return self._pending

    def restore(self, state: dict | None) -> None:
        """``state`` (checked already) is where the next iteration starts, on every pipeline of this process
        (None: no state, forget one waiting)."""
        with self._lock:
            self._pending = state
            self._streams, self._received = {}, 0

    def start(self, iterator, pipeline: int) -> tuple[dict | None, Stream | None]:
        """An iteration of ``pipeline`` starts reading with ``iterator`` (not started yet): the state it was
        restored to (None: none waited), and its ``Stream`` to record into (None: nothing is recorded)."""
        with self._lock:
            restored = self._pending
            if restored is not None:
                iterator.set_state(restored)
            if not self.active:
                return restored, None
            if not self._streams or pipeline in self._streams:  # a new iteration: the loop left the last one
                self._generation += 1
                self._streams, self._received = {}, 0
            stream = self._streams[pipeline] = Stream(self._generation)
            stream.states[0] = iterator.get_state()
            return restored, stream

    def produced(self, stream: Stream, iterator) -> None:
        """``stream``'s iterator delivered one more step to tf.data."""
        with self._lock:
            if stream.generation != self._generation:
                return  # an iteration the loop has left (e.g. Keras ended an epoch early)
            states = stream.states
            states[next(reversed(states)) + 1] = iterator.get_state()
            if len(states) > _MAX_AHEAD:
                states.popitem(last=False)

    def received(self, steps: int = 1) -> None:
        """The loop received ``steps`` more steps of the current iteration."""
        with self._lock:
            self._pending = None  # every pipeline started with it: the loop got a step of each
            self._received += steps
            for stream in self._streams.values():
                while stream.states and next(iter(stream.states)) < self._received:
                    stream.states.popitem(last=False)

    def state(self) -> dict | None:
        """The reader state after the steps the loop received (None: nothing read or restored yet)."""
        with self._lock:
            if not self._streams:
                return self._pending
            stream = self._streams[min(self._streams)]
            if self._received not in stream.states:
                raise UsageError(
                    f"the training loop says it received {self._received} steps of this iteration, but the "
                    f"reader has no state for that step (it produced {next(reversed(stream.states), 0)}, "
                    f"{_MAX_AHEAD} are kept): count only the steps of the dataset whose position you save"
                )
            return stream.states[self._received]
