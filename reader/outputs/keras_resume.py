"""Keras ``BackupAndRestore`` that also backs up where the dataset is, so ``fit`` resumes mid-epoch exactly.

Keras 3's ``BackupAndRestore(save_freq=<int>)`` saves the weights mid-epoch but on restart runs the
interrupted epoch again from its first step (the batch it saves is not used): the rows trained on before
the backup would be trained on twice. This subclass saves, in the same ``_save_model``, the reader state
of the steps ``fit`` trained on (``reader.outputs.step_ledger``: tf.data reads ahead of ``fit``) to
``reader_state.json`` in the backup directory, and restores it ``on_train_begin``: the interrupted epoch
then delivers only its rows not yet trained on, on any replica count or global batch.

``fit`` runs one number of steps per epoch. When that is the dataset's ``steps_per_epoch`` (fit's epochs
are the data's), the resumed epoch has fewer: the callback ends it after ``steps_left_in_epoch`` steps
(``stop_training``, undone at the epoch's end) and the next epochs are whole; a backup taken after an
epoch's last step resumes at the next epoch. When fit's epochs are not the data's (``num_epochs=None``
and another ``steps_per_epoch``), the stream just continues where it was. Under a multi-worker strategy
every worker writes its own state to the same file (atomically): synchronous workers are at one step,
and any one's state restores every worker of the next job.
"""

from __future__ import annotations

import json

import keras

from schemas import storage
from schemas.errors import UsageError

STATE_FILE = "reader_state.json"


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """``keras.callbacks.BackupAndRestore(backup_dir, **options)`` plus ``dataset``'s position."""

    def __init__(self, dataset, backup_dir: str, **options) -> None:
        if options.get("double_checkpoint"):
            raise UsageError(
                "backup_and_restore(double_checkpoint=True): Keras's fallback to the previous weights would "
                "restore them with the latest reader position; leave double_checkpoint off"
            )
        super().__init__(backup_dir, **options)
        self._dataset = dataset
        self._ledger = dataset._tf_ledger
        self._state_path = f"{backup_dir.rstrip('/')}/{STATE_FILE}"
        self._short_epoch: tuple[int, int] | None = None  # (fit epoch, its steps) of a resumed epoch
        self._stopped_early = False
        self._epoch_steps = 0  # steps fit has run in the current epoch

    def _aligned(self) -> bool:
        """Whether fit's epochs are the dataset's epochs."""
        return self.params.get("steps") == self._dataset.steps_per_epoch

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if not storage.exists(self._state_path):
            return
        saved = json.loads(storage.read_bytes(self._state_path))
        state = saved["reader"]
        self._dataset._restore_tf_position(state)
        if not self._aligned():
            return
        self.model._initial_epoch = saved["epoch"]
        if _at_epoch_start(state):
            return  # a whole epoch is next
        steps = self._dataset.steps_left_in_epoch(state)
        per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
        if steps % per_execution:
            raise UsageError(
                f"the epoch resumed from {self.backup_dir} has {steps} steps left, not a multiple of the model's "
                f"steps_per_execution={per_execution}: fit would read past it; compile with steps_per_execution=1"
            )
        self._short_epoch = (saved["epoch"], steps)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._ledger.received(batch + 1 - self._epoch_steps)
        self._epoch_steps = batch + 1
        super().on_train_batch_end(batch, logs)
        short = self._short_epoch
        if short is not None and short[0] == self._current_epoch and self._epoch_steps >= short[1]:
            self.model.stop_training = self._stopped_early = True

    def on_epoch_end(self, epoch, logs=None):
        if self._stopped_early:  # the resumed epoch ended: the next ones run
            self.model.stop_training = self._stopped_early = False
            self._short_epoch = None
        self._epoch_steps = 0  # a save now (save_freq="epoch") counts the epoch done, as Keras's does
        super().on_epoch_end(epoch, logs)

    def _save_model(self):
        super()._save_model()
        state = self._ledger.state()
        if state is None:
            return
        epoch = self._current_epoch
        if self._aligned() and self._epoch_steps and _at_epoch_start(state):
            epoch += 1  # saved after the epoch's last step (on_epoch_end has not counted it yet)
        storage.atomic_write(self._state_path, json.dumps({"epoch": epoch, "reader": state}).encode())


def _at_epoch_start(state: dict) -> bool:
    """Whether ``state`` is at the first step of a whole epoch (not of a remainder an elastic restore left)."""
    return state.get("step") == 0 and state.get("remainder") is None
