"""One worker of a two-worker ``MultiWorkerMirroredStrategy`` job (run by tests/reader/outputs/test_multi_worker.py).

Usage: ``TF_CONFIG=... python multi_worker_fit.py RESULT.json SHARD_POLICY SNAPSHOT...``. For each
snapshot the worker trains a tiny Keras model with ``fit`` over ``reader.distributed_dataset(...,
strategy=...)`` for two epochs and writes, per snapshot, the ids each training step consumed on this
worker, the steps Keras showed and ran per epoch, the losses and any "ran out of data" warning. One
strategy serves every snapshot: a second one in a process collides with the first's collective keys.

Keras 3's ``fit`` under MultiWorkerMirroredStrategy trips over two of its own calls to
``strategy.reduce`` (keras-team/keras#20585), which the model here steps around: it reduces the first
batch, which that strategy cannot do for a nest such as ``(x, y)`` (so each element is one tensor of
value, target and id that the model splits), and it averages the step's logs over ``axis=0`` (so
``train_step`` returns them as vectors of one value).
"""

import json
import sys
import warnings

import keras
import tensorflow as tf

import reader

GLOBAL_BATCH, EPOCHS, SEED = 64, 2, 7


def packed(batch):
    """``map_fn``: columns value (the feature), its target and the row id, side by side."""
    x = batch["value"] / 500.0
    return tf.stack([x, 2.0 * x + 1.0, tf.cast(batch["id"], tf.float32)], axis=1)


class PackedRegression(keras.Model):
    """A Dense layer on column 0, trained towards column 1; records column 2 (row ids) of every step it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.consumed: list[list[int]] = []

    def call(self, packed_batch):
        return self.dense(packed_batch[:, :1])

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return super().compute_loss(x, x[:, 1:2], y_pred, sample_weight, training)

    def train_step(self, packed_batch):
        tf.py_function(self._record, [packed_batch[:, 2]], [])
        logs = super().train_step(packed_batch)
        return {name: tf.reshape(value, [1]) for name, value in logs.items()}

    def _record(self, ids) -> None:
        self.consumed.append([int(i) for i in ids.numpy()])


class StepCounter(keras.callbacks.Callback):
    """Batches Keras ran per epoch (``on_train_batch_end``) and the steps it announced."""

    def __init__(self) -> None:
        super().__init__()
        self.ran, self.shown = [], []

    def on_epoch_begin(self, epoch, logs=None):
        self.ran.append(0)
        self.shown.append(self.params["steps"])

    def on_train_batch_end(self, batch, logs=None):
        self.ran[-1] += 1


def fit(strategy, path: str, shard_policy: str) -> dict:
    dataset = reader.distributed_dataset(
        path, GLOBAL_BATCH, strategy=strategy, shard_policy=shard_policy, seed=SEED, num_epochs=None, map_fn=packed
    )
    with strategy.scope():
        model = PackedRegression()
        model.compile(optimizer="sgd", loss="mse")
    steps = StepCounter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(
            dataset.tf_dataset, epochs=EPOCHS, steps_per_epoch=dataset.steps_per_epoch, callbacks=[steps], verbose=0
        )
    return {
        "steps_per_epoch": dataset.steps_per_epoch,
        "shown": steps.shown,
        "ran": steps.ran,
        "consumed": model.consumed,
        "losses": history.history["loss"],
        "warnings": [str(w.message) for w in caught if "ran out of data" in str(w.message)],
    }


def main(result_path: str, shard_policy: str, paths: list[str]) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    results = {path: fit(strategy, path, shard_policy) for path in paths}
    with open(result_path, "w") as result:
        json.dump({"task": strategy.cluster_resolver.task_id, "results": results}, result)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
