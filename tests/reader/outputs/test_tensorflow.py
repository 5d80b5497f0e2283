"""TensorFlow output: element_spec, tf.distribute MirroredStrategy over 2 CPU replicas, Keras fit."""

import numpy as np
import pytest

import reader

tf = pytest.importorskip("tensorflow")


def regression_model():
    layers = tf.keras.layers
    inputs = {
        "value": tf.keras.Input(shape=(), name="value"),
        "image": tf.keras.Input(shape=(4, 4, 3), dtype="uint8", name="image"),
    }
    image = layers.Flatten()(layers.Rescaling(1 / 255)(inputs["image"]))
    value = layers.Rescaling(1 / 1000)(layers.Reshape((1,))(inputs["value"]))
    hidden = layers.Concatenate()([value, image])
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(hidden))
    model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="mse")
    return model


def features_and_target(batch):
    return {"value": batch["value"], "image": batch["image"]}, batch["value"] / 500.0 + 1.0


def test_element_spec_is_a_tf_function_input_signature(uneven_snapshot):
    dataset = reader.distributed_dataset(uneven_snapshot, 32, output="tf", columns=["id", "image"], seed=1)
    spec = dataset.element_spec
    assert spec["image"] == tf.TensorSpec((None, 4, 4, 3), tf.uint8, name="image")

    @tf.function(input_signature=[spec])
    def total(batch):
        return tf.reduce_sum(batch["id"]), tf.shape(batch["image"])[0]

    sums = [total(step) for step in dataset]
    assert sum(int(s) for s, _ in sums) == sum(range(2000)) and int(sums[0][1]) == 32


def test_keras_fit_with_distribute_datasets_from_function(uneven_snapshot, strategy):
    def dataset_fn(context):
        per_replica = context.get_per_replica_batch_size(64)
        return reader.dataset(uneven_snapshot, per_replica, input_context=context, seed=4).map(features_and_target)

    with strategy.scope():
        model = regression_model()
    history = model.fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=3, verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 3 and np.all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_keras_fit_with_distributed_dataset_strategy(uneven_snapshot, strategy):
    dataset = reader.distributed_dataset(uneven_snapshot, 64, strategy=strategy, seed=4, map_fn=features_and_target)
    with strategy.scope():
        model = regression_model()
    history = model.fit(dataset.tf_dataset, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert len(losses) == 3 and np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    # iterating it yields PerReplica values usable directly in strategy.run
    features, target = next(iter(dataset))
    local = strategy.experimental_local_results(features["image"])
    assert len(local) == 2 and all(t.shape == (32, 4, 4, 3) for t in local)


def test_custom_loop_with_strategy_run_and_partial_batches(range_root, strategy):
    dataset = reader.distributed_dataset(range_root / "range6", 4, strategy=strategy, shuffle=False)

    @tf.function
    def step_fn(batch):
        return strategy.run(lambda b: b["id"] * 1, args=(batch,))

    per_step = [[t.numpy().tolist() for t in strategy.experimental_local_results(step_fn(batch))] for batch in dataset]
    assert per_step == [[[0, 1], [2, 3]], [[4], [5]]]


def test_empty_replica_batches_reach_strategy_run(range_root, strategy):
    # 4 rows, global batch 3 over 2 replicas: [0,1],[2] then [3],[] (seed 003's partial-batch rule)
    dataset = reader.distributed_dataset(range_root / "range4", 3, strategy=strategy, shuffle=False)
    per_step = [[t.numpy().tolist() for t in strategy.experimental_local_results(b["id"])] for b in dataset]
    assert per_step == [[[0, 1], [2]], [[3], []]]
