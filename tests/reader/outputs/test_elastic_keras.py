"""Elastic resume through TensorFlow: the steps left of a restored epoch, a custom loop's position in a
``tf.train.Checkpoint``, and Keras ``fit`` with ``dataset.backup_and_restore`` interrupted mid-epoch, resumed
with another replica count and global batch: the interrupted epoch's rows once, the next epoch whole."""

import collections
import json
import pathlib
import subprocess
import sys

import pytest

import reader
from examples import elastic_resume_keras
from schemas.errors import UsageError
from tests import helpers
from tests.helpers import state_refusal
from tests.reader.core.test_elastic_resume import ROWS, dataset, exactly_once, first_steps
from tests.reader.outputs.test_multi_worker import run_cluster

tf = pytest.importorskip("tensorflow")


@pytest.mark.parametrize("pipelines, batch", [(1, 96), (3, 48), (5, 50)], ids=str)
def test_steps_left_in_epoch_are_the_steps_a_restored_pipeline_delivers(uneven_snapshot, pipelines, batch):
    _, state = first_steps(uneven_snapshot, 3)  # 4 pipelines, global batch 64
    for pipeline in range(pipelines):
        restored = dataset(uneven_snapshot, pipelines, pipeline, pipelines, batch)
        expected = restored.steps_left_in_epoch(state)
        iterator = iter(restored)
        iterator.set_state(state)
        delivered = 0
        while iterator.get_state()["epoch"] == 0:
            next(iterator)
            delivered += 1
        assert delivered == expected < restored.steps_per_epoch
    same = dataset(uneven_snapshot, 4, 0, 4, 64)
    assert same.steps_left_in_epoch(state) == same.steps_per_epoch - 3, "the same topology: the steps not taken"


def tf_ids(step) -> list[int]:
    """The ids of a TF step: per-replica values under a strategy, else one replica's batch."""
    if isinstance(step["id"], tf.distribute.DistributedValues):
        return [i for batch in step["id"].values for i in batch.numpy().tolist()]
    return step["id"].numpy().tolist()


def test_a_checkpoint_of_two_replicas_restores_one_with_another_batch(uneven_snapshot, strategy, tmp_path):
    before = reader.distributed_dataset(uneven_snapshot, 64, strategy=strategy, seed=3, num_epochs=2, columns=["id"])
    steps = before.tf_steps()
    checkpoint = tf.train.Checkpoint(data=steps)
    iterator = iter(steps)
    seen = [i for _ in range(4) for i in tf_ids(next(iterator))]  # tf.data has read steps ahead of these
    path = checkpoint.write(str(tmp_path / "ckpt"))
    seen += [i for _ in range(2) for i in tf_ids(next(iterator))]  # trained after the checkpoint: lost

    after = reader.distributed_dataset(uneven_snapshot, 48, seed=3, num_epochs=2, columns=["id"])
    restored = after.tf_steps()
    tf.train.Checkpoint(data=restored).restore(path)
    left = restored.steps_left_in_epoch
    epochs = collections.defaultdict(list)
    for count, step in enumerate(restored):
        epochs[0 if count < left else 1].append(tf_ids(step))
    exactly_once(seen[: 4 * 64] + [i for step in epochs[0] for i in step])
    assert len(epochs[0]) == left == -(-(ROWS - 4 * 64) // 48)
    assert len(epochs[1]) == after.steps_per_epoch
    exactly_once([i for step in epochs[1] for i in step])


def test_a_state_of_another_snapshot_is_refused_in_one_line(uneven_snapshot, range_root, tmp_path):
    other = reader.distributed_dataset(str(range_root / "range12"), 4, seed=3, columns=["id"]).tf_steps()
    next(iter(other))
    path = tf.train.Checkpoint(data=other).write(str(tmp_path / "ckpt"))
    steps = reader.distributed_dataset(uneven_snapshot, 64, seed=3, columns=["id"]).tf_steps()
    assert "saved reading another snapshot" in state_refusal(steps, other.get_state())
    with pytest.raises(UsageError, match="saved reading another snapshot"):
        tf.train.Checkpoint(data=steps).restore(path)


def by_epoch(*runs: dict) -> dict[int, list[int]]:
    rows = collections.defaultdict(list)
    for run in runs:
        for epoch, row in run["trained"]:
            rows[epoch].append(row)
    return rows


@pytest.mark.parametrize(
    "stop_after", [5, pytest.param(32, marks=pytest.mark.slow)], ids=["mid-epoch", "after-the-epochs-last-step"]
)
def test_keras_fit_resumes_the_interrupted_epoch_on_one_replica(uneven_snapshot, strategy, tmp_path, stop_after):
    """2 replicas, global batch 64 (32 steps an epoch), interrupted right after a backup; 1 replica, batch 48."""
    backup = str(tmp_path / "backup")
    first = elastic_resume_keras.train(uneven_snapshot, backup, strategy, 64, stop_after, save_every=stop_after)
    with open(f"{backup}/reader_state.json") as file:
        saved = json.load(file)
    assert (saved["epoch"], saved["reader"]["step"]) == ((0, 5) if stop_after == 5 else (1, 0))
    second = elastic_resume_keras.train(uneven_snapshot, backup, None, 48)
    rows = by_epoch(first, second)
    exactly_once(rows[0])
    exactly_once(rows[1])
    whole = second["steps_per_epoch"]
    assert second["steps"] == ({0: -(-(ROWS - 5 * 64) // 48), 1: whole} if stop_after == 5 else {1: whole})
    assert not first["ran_out"] and not second["ran_out"]


@pytest.mark.slow  # 2 fits: about 15 s
def test_keras_epochs_that_are_not_the_datas_continue_the_stream(uneven_snapshot, tmp_path):
    """num_epochs=None and fit's steps_per_epoch=10 (a data epoch is 32 steps of 64): the stream goes on."""
    backup, endless = str(tmp_path / "backup"), {"num_epochs": None, "steps_per_epoch": 10}
    first = elastic_resume_keras.train(uneven_snapshot, backup, None, 64, stop_after=5, **endless)
    second = elastic_resume_keras.train(uneven_snapshot, backup, None, 48, **endless)
    assert second["steps"] == {0: 10, 1: 10}, "Keras reruns its epoch 0 in full: its epochs are not the data's"
    rows = [row for run in (first, second) for _, row in run["trained"]]
    assert len(rows) == 5 * 64 + 20 * 48 == len(set(rows)), "data epoch 0 continued where it was: no row twice"


@pytest.mark.slow  # 2 processes of TensorFlow and Keras: about 40 s on 2 loaded cores
def test_keras_example_resumes_in_another_process_with_other_replicas(uneven_snapshot, tmp_path):
    done = helpers.run_module("examples.elastic_resume_keras", uneven_snapshot, str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    first, second = result["first"], result["second"]
    assert (first["replicas"], second["replicas"]) == (2, 1)
    rows = by_epoch(first, second)
    exactly_once(rows[0])
    exactly_once(rows[1])
    assert second["steps"] == {"0": -(-(ROWS - 5 * 64) // 48), "1": second["steps_per_epoch"]}
    assert done.stdout.startswith(f"epoch 0: {ROWS} rows ({ROWS} distinct) over 2 runs")


def test_backup_and_restore_refuses_a_double_checkpoint(uneven_snapshot, tmp_path):
    dataset = reader.distributed_dataset(uneven_snapshot, 64, columns=["id"])
    with pytest.raises(UsageError, match="double_checkpoint") as refused:
        dataset.backup_and_restore(str(tmp_path), double_checkpoint=True)
    assert "\n" not in str(refused.value)


@pytest.mark.slow  # 3 TensorFlow processes, 2 of them a MultiWorkerMirroredStrategy cluster: about 40 s
def test_the_chiefs_checkpoint_of_two_workers_restores_one_process(uneven_snapshot, tmp_path):
    program = str(pathlib.Path(__file__).with_name("tf_checkpoint_program.py"))
    saved = [str(tmp_path / f"saved{index}.json") for index in range(2)]
    run_cluster(tmp_path, lambda index: [program, "save", saved[index], uneven_snapshot, str(tmp_path / "ckpt"), "6"])
    workers = [json.loads(pathlib.Path(path).read_text()) for path in saved]
    assert [len(worker["steps"]) for worker in workers] == [6, 6]
    assert workers[0]["rows_all_reduced"] == 6 * 64
    resumed = str(tmp_path / "resumed.json")
    done = subprocess.run(
        [sys.executable, program, "resume", resumed, uneven_snapshot, str(tmp_path / "ckpt/chief/ckpt"), "100"],
        env=helpers.cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    after = json.loads(pathlib.Path(resumed).read_text())
    left = after["left"]
    assert left == -(-(ROWS - 6 * 64) // 100) == len(after["steps"]) - after["steps_per_epoch"]
    trained = [i for worker in workers for step in worker["steps"] for i in step]
    exactly_once(trained + [i for step in after["steps"][:left] for i in step])
    exactly_once([i for step in after["steps"][left:] for i in step])
