"""A custom TF training loop's steps whose position a ``tf.train.Checkpoint`` saves and restores.

A ``tf.data`` iterator over ``from_generator`` cannot be checkpointed, and what it has read is ahead of
the loop anyway, so what a checkpoint carries is the reader's own state at the steps the loop received
(``reader.outputs.step_ledger``), as a JSON string tensor. Restoring it makes the next iteration resume
there, on any number of replicas, workers or global batch (``reader.core.elastic``): the chief's
checkpoint restores every worker.

    steps = dataset.tf_steps()
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, data=steps)
    checkpoint.restore(path)             # before iterating
    for step in steps:                   # next() outside tf.function: each step is counted as received
        strategy.run(train_step, args=(step,))
"""

from __future__ import annotations

import itertools
import json

import tensorflow as tf

from schemas.errors import UsageError


class TFSteps(tf.__internal__.tracking.Trackable):
    """Iterating gives ``dataset.tf_dataset``'s steps (per-replica values under a strategy); its position is
    a trackable ``tf.train.Checkpoint`` saves: the reader state after the steps iterated so far."""

    def __init__(self, dataset) -> None:
        self._dataset = dataset
        self._ledger = dataset._tf_ledger
        # Without a strategy tf_dataset yields a step's per-replica batches one after another.
        self._elements_per_step = 1 if dataset._strategy is not None else dataset.replicas

    def __iter__(self):
        # A restored iteration is shorter than tf.data's cardinality says: stop at its end, never asking
        # tf.data for the element that would fail its cardinality check.
        steps = self._dataset._restored_iteration_steps()
        elements = iter(self._dataset.tf_dataset)
        ledger, per_step = self._ledger, self._elements_per_step
        if steps is not None:
            elements = itertools.islice(elements, steps * per_step)
        for count, element in enumerate(elements, 1):
            if count % per_step == 0:
                ledger.received()
            yield element

    def get_state(self) -> dict | None:
        """The reader state after the steps received (a restored one before the first; None: nothing read)."""
        return self._ledger.state()

    def set_state(self, state: dict) -> None:
        """The next iteration resumes at ``state``; one that is not this dataset's is refused in one line."""
        self._dataset._restore_tf_position(state)

    @property
    def steps_left_in_epoch(self) -> int:
        """Steps of the epoch the position is in still to come (after a restore: that epoch's steps)."""
        state = self.get_state()
        return self._dataset.steps_per_epoch if state is None else self._dataset.steps_left_in_epoch(state)

    def _serialize_to_tensors(self) -> dict:
        state = self.get_state()
        return {"state": tf.constant("" if state is None else json.dumps(state))}

    def _restore_from_tensors(self, restored_tensors: dict):
        text = restored_tensors["state"].numpy().decode()
        if text:
            try:
                state = json.loads(text)
            except ValueError as error:
                raise UsageError(f"the checkpoint's snapfeed position is not JSON ({error}): {text:.200}") from None
            self.set_state(state)
        return tf.no_op()
