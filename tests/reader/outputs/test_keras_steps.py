"""Keras ``fit`` over ``distributed_dataset(strategy=...).tf_dataset`` runs exactly ``steps_per_epoch`` steps.

Each replica count runs in a process of its own: logical CPU devices must be
set before TensorFlow starts, and a second MirroredStrategy in one process
aborts Keras (tests/conftest.py).
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests import helpers

pytest.importorskip("tensorflow")

ROWS, BATCH, EPOCHS = 6000, 256, 3
STEPS = -(-ROWS // BATCH)  # 24, the last one partial

FIT_SCRIPT = """
import json, sys, warnings
import tensorflow as tf

path, replicas = sys.argv[1], int(sys.argv[2])
cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * replicas)
import keras
import reader

strategy = tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")][:replicas])
results = {}
for num_epochs, pass_steps in ((1, False), (None, True), (3, True)):
    dataset = reader.distributed_dataset(
        path, 256, strategy=strategy, seed=0, num_epochs=num_epochs, map_fn=lambda b: (b["x"], b["y"])
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")

    class Steps(keras.callbacks.Callback):
        shown, ran = [], []

        def on_epoch_begin(self, epoch, logs=None):
            self.shown.append(self.params["steps"])
            self.start = int(self.model.optimizer.iterations.numpy())

        def on_epoch_end(self, epoch, logs=None):
            self.ran.append(int(self.model.optimizer.iterations.numpy()) - self.start)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(
            dataset.tf_dataset,
            epochs=3,
            steps_per_epoch=dataset.steps_per_epoch if pass_steps else None,
            callbacks=[Steps()],
            verbose=0,
        )
    results[str(num_epochs)] = {
        "steps_per_epoch": dataset.steps_per_epoch,
        "shown": Steps.shown,
        "ran": Steps.ran,
        "warnings": [str(w.message) for w in caught if "ran out of data" in str(w.message)],
    }
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def regression_snapshot(tmp_path_factory):
    x = np.random.default_rng(0).normal(size=(ROWS, 4)).astype(np.float32)
    y = x.sum(axis=1)
    batches = [{"x": x[s : s + 1000], "y": y[s : s + 1000]} for s in range(0, ROWS, 1000)]
    return helpers.write_snapshot(tmp_path_factory.mktemp("keras"), "regression", batches)


@pytest.mark.parametrize(
    "replicas", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(4, marks=pytest.mark.slow)]
)
def test_fit_runs_and_shows_steps_per_epoch(regression_snapshot, replicas):
    completed = subprocess.run(
        [sys.executable, "-c", FIT_SCRIPT, regression_snapshot, str(replicas)],
        capture_output=True,
        text=True,
        env=helpers.cli_env(),
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    for num_epochs in ("1", "None", "3"):
        result = results[num_epochs]
        assert result["steps_per_epoch"] == STEPS
        assert result["shown"] == [STEPS] * EPOCHS, f"num_epochs={num_epochs}: {result}"
        assert result["ran"] == [STEPS] * EPOCHS, f"num_epochs={num_epochs}: {result}"
        assert result["warnings"] == [], f"num_epochs={num_epochs}: {result}"
