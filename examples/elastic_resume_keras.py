"""Keras ``fit`` interrupted mid-epoch on 2 replicas resumes on 1 replica with another global batch.

    python -m examples.elastic_resume_keras SNAPSHOT [WORKDIR]

The snapshot needs an int64 ``id`` and a float ``value`` column (``tests.helpers.id_batches``). Each run is a
process of its own (a MirroredStrategy over logical CPU devices, set before TensorFlow starts): the first
trains on 2 replicas with global batch 64 and ``dataset.backup_and_restore(save_freq=5)``, and is killed by
an exception after step 5, right after a backup; the second builds the dataset for 1 replica and global
batch 48, and the same callback resumes it: the interrupted epoch delivers only the rows the first run did
not train on, in ``steps_left_in_epoch`` steps, then the next epoch is whole. The model records the ids of
every batch it trains on; the last line printed is what each run trained on, as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings

EPOCHS, SAVE_EVERY = 2, 5


def mirrored_strategy(replicas: int):
    """A MirroredStrategy over ``replicas`` logical CPU devices (set before TensorFlow starts: one per process)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    return tf.distribute.MirroredStrategy([device.name for device in tf.config.list_logical_devices("CPU")])


def train(
    snapshot: str,
    backup_dir: str,
    strategy,
    global_batch: int,
    stop_after: int = -1,
    save_every: int = SAVE_EVERY,
    num_epochs: int | None = 1,
    steps_per_epoch: int | None = None,
) -> dict:
    """``fit`` for 2 epochs under ``strategy`` (None: Keras's default), backed up every ``save_every`` steps and
    stopped after ``stop_after``; ``num_epochs``: the dataset's, ``steps_per_epoch``: fit's."""
    import contextlib

    import keras
    import tensorflow as tf

    import reader

    dataset = reader.distributed_dataset(
        snapshot, global_batch, strategy=strategy, seed=0, num_epochs=num_epochs, columns=["id", "value"]
    )
    trained: list[list] = []  # [fit epoch, id] of every row a replica trained on

    class Recording(keras.Model):
        """Fits y = 2x and records the ids of each batch it trains on (a replica's batch may be empty)."""

        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)
            self.epoch = 0

        def call(self, batch):
            return self.dense(tf.reshape(batch["value"], (-1, 1)) / 1000)

        def train_step(self, data):
            tf.numpy_function(lambda ids: trained.extend([self.epoch, i] for i in ids.tolist()), [data["id"]], [])
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(self(data, training=True)[:, 0] - data["value"] / 500)) / global_batch
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            return {"loss": loss}

    steps: dict[int, int] = {}  # steps fit ran, by fit epoch

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.model.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            steps[self.model.epoch] = steps.get(self.model.epoch, 0) + 1
            if sum(steps.values()) == stop_after:
                raise KeyboardInterrupt(f"interrupted after {stop_after} steps")

    with strategy.scope() if strategy else contextlib.nullcontext():
        model = Recording()
        model({"id": tf.zeros([1], tf.int64), "value": tf.zeros([1])})  # BackupAndRestore needs it built
        model.compile(optimizer="sgd")
    backup = dataset.backup_and_restore(backup_dir, save_freq=save_every)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            callbacks = [backup, Interrupt()]
            model.fit(
                dataset.tf_dataset, epochs=EPOCHS, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=0
            )
        except KeyboardInterrupt:
            pass
    return {
        "replicas": strategy.num_replicas_in_sync if strategy else 1,
        "steps_per_epoch": dataset.steps_per_epoch,
        "steps": steps,
        "ran_out": [str(w.message) for w in caught if "ran out of data" in str(w.message)],
        "trained": trained,
    }


def run(snapshot: str, backup_dir: str, replicas: int, global_batch: int, stop_after: int = -1) -> dict:
    """``train`` in a new process, as after a preemption: its result."""
    argv = [snapshot, backup_dir, str(replicas), str(global_batch), str(stop_after)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-m", "examples.elastic_resume_keras", "train", *argv], capture_output=True, text=True, env=env
    )
    if done.returncode:
        raise RuntimeError(f"the {replicas}-replica run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main(snapshot: str, workdir: str) -> None:
    backup_dir = os.path.join(workdir, "backup")
    first = run(snapshot, backup_dir, replicas=2, global_batch=64, stop_after=SAVE_EVERY)
    second = run(snapshot, backup_dir, replicas=1, global_batch=48)
    rows = {epoch: [i for e, i in first["trained"] + second["trained"] if e == epoch] for epoch in range(EPOCHS)}
    print(
        f"epoch 0: {len(rows[0])} rows ({len(set(rows[0]))} distinct) over 2 runs, "
        f"epoch 1: {len(rows[1])} rows ({len(set(rows[1]))} distinct) on 1 replica"
    )
    print(json.dumps({"first": first, "second": second}))


if __name__ == "__main__":
    if sys.argv[1] == "train":
        path, backup, replicas, batch, stop = sys.argv[2:7]
        print(json.dumps(train(path, backup, mirrored_strategy(int(replicas)), int(batch), int(stop))))
    else:
        main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="snapfeed-keras-"))
