"""``strategy=`` with ``placement=PlacementOptions(input_options=...)``: tf.distribute.InputOptions act as with
distribute_datasets_from_function.

MirroredStrategy over the two logical CPUs of tests/conftest.py: CPU:0 is also the host device,
so a batch fetched to replica 1's device is on CPU:1 and one left on the host is on CPU:0.
"""

import math
import warnings

import pytest

import reader
from schemas.errors import UsageError
from tests import helpers

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

#: A dataset per replica, placed on the replica's device (tf.distribute refuses fetch_to_device with it).
PER_REPLICA = tf.distribute.InputOptions(
    experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA,
    experimental_place_dataset_on_device=True,
    experimental_fetch_to_device=False,
)


@pytest.fixture
def per_replica_strategy(strategy):
    """The session's strategy, given back as it was: a MirroredStrategy that once distributed a dataset
    PER_REPLICA keeps its input devices per replica for every later dataset (tf.distribute stores them)."""
    input_devices = strategy.extended._input_workers_devices
    yield strategy
    strategy.extended._input_workers_devices = input_devices


def steps_on_devices(strategy, steps) -> list[list[tuple[int, list[int]]]]:
    """Per step, each replica's (device index, ids)."""
    return [
        [
            (tf.DeviceSpec.from_string(ids.device).device_index, ids.numpy().tolist())
            for ids in strategy.experimental_local_results(step["id"])
        ]
        for step in steps
    ]


@pytest.mark.parametrize("fetch_to_device, devices", [(True, [0, 1]), (False, [0, 0])])
def test_fetch_to_device_puts_batches_on_replica_devices_or_leaves_them_on_the_host(
    range_root, strategy, fetch_to_device, devices
):
    options = tf.distribute.InputOptions(experimental_fetch_to_device=fetch_to_device)
    dataset = reader.distributed_dataset(
        range_root / "range8",
        4,
        strategy=strategy,
        shuffle=False,
        placement=reader.PlacementOptions(input_options=options),
    )
    assert steps_on_devices(strategy, dataset) == [
        list(zip(devices, [[0, 1], [2, 3]], strict=True)),
        list(zip(devices, [[4, 5], [6, 7]], strict=True)),
    ]


def test_per_replica_buffer_size_keeps_the_steps(range_root, strategy):
    def steps(input_options):
        dataset = reader.distributed_dataset(
            range_root / "range12",
            4,
            strategy=strategy,
            seed=3,
            placement=reader.PlacementOptions(input_options=input_options),
        )
        return steps_on_devices(strategy, dataset.tf_dataset)

    buffered = steps(tf.distribute.InputOptions(experimental_per_replica_buffer_size=3))
    assert buffered == steps(None)
    assert sorted(i for step in buffered for _, ids in step for i in ids) == list(range(12))


def test_per_replica_mode_gives_each_replica_its_own_input_pipeline(range_root, per_replica_strategy):
    strategy = per_replica_strategy
    # dataset_fn runs once per replica (input pipeline r of 2): AUTO gives replica r the r-th half
    dataset = reader.distributed_dataset(
        range_root / "range10",
        4,
        strategy=strategy,
        shuffle=False,
        placement=reader.PlacementOptions(input_options=PER_REPLICA),
    )
    assert steps_on_devices(strategy, dataset) == [
        [(0, [0, 1]), (1, [5, 6])],
        [(0, [2, 3]), (1, [7, 8])],
        [(0, [4]), (1, [9])],
    ]
    assert dataset.steps_per_epoch == 3


def test_keras_fit_with_per_replica_pipelines_runs_steps_per_epoch(uneven_snapshot, per_replica_strategy):
    strategy = per_replica_strategy
    dataset = reader.distributed_dataset(
        uneven_snapshot,
        64,
        strategy=strategy,
        seed=1,
        map_fn=lambda batch: (tf.reshape(batch["value"], (-1, 1)) / 1000, batch["value"] / 500),
        placement=reader.PlacementOptions(input_options=PER_REPLICA),
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(dataset.tf_dataset, epochs=2, verbose=0)
    assert dataset.steps_per_epoch == 32  # 2000 rows, 64 a step
    assert int(model.optimizer.iterations.numpy()) == 2 * dataset.steps_per_epoch
    assert not [w for w in caught if "ran out of data" in str(w.message)]


def test_input_options_that_are_not_tf_distribute_input_options_are_one_clear_error(range_root, strategy):
    with pytest.raises(
        UsageError, match=r"is not a tf\.distribute\.InputOptions; pass tf\.distribute\.InputOptions\("
    ) as error:
        reader.distributed_dataset(
            range_root / "range4",
            2,
            strategy=strategy,
            placement=reader.PlacementOptions(input_options={"experimental_fetch_to_device": False}),
        )
    assert "\n" not in str(error.value)


def test_an_option_combination_tf_distribute_refuses_is_its_one_line_error(range_root, strategy):
    options = tf.distribute.InputOptions(experimental_place_dataset_on_device=True)  # needs PER_REPLICA
    dataset = reader.distributed_dataset(
        range_root / "range4", 2, strategy=strategy, placement=reader.PlacementOptions(input_options=options)
    )
    with pytest.raises(ValueError, match="PER_REPLICA") as error:
        _ = dataset.element_spec
    assert "\n" not in str(error.value)


def test_steps_per_epoch_are_those_of_the_pipelines_tf_distribute_built(tmp_path, per_replica_strategy):
    # PER_REPLICA: two input pipelines in this process, as two workers would have; FILE hands them whole
    # shards, so one holds more than half the rows and an epoch takes more steps than one pipeline would
    shards = helpers.write_snapshot(
        tmp_path, "shards", helpers.id_batches([1000]), block_size_bytes=1800, shard_size_bytes=12_000
    )
    dataset = reader.distributed_dataset(
        shards,
        64,
        strategy=per_replica_strategy,
        shard_policy="FILE",
        shuffle=False,
        placement=reader.PlacementOptions(input_options=PER_REPLICA),
    )
    pipeline_steps = reader.distributed_dataset(
        shards, 64, input_context=reader.InputContext(2, 0, 2), shard_policy="FILE"
    ).steps_per_epoch
    assert pipeline_steps > math.ceil(1000 / 64)
    assert dataset.steps_per_epoch == pipeline_steps
    steps = steps_on_devices(per_replica_strategy, dataset)
    assert len(steps) == pipeline_steps
    assert sorted(i for step in steps for _, ids in step for i in ids) == list(range(1000))
