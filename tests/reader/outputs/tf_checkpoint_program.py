"""A custom ``strategy.run`` loop whose reader position travels in a ``tf.train.Checkpoint`` (run by
tests/reader/outputs/test_elastic_keras.py).

Usage: ``TF_CONFIG=... python tf_checkpoint_program.py save RESULT.json SNAPSHOT CHECKPOINT_DIR STEPS`` on each
worker of a ``MultiWorkerMirroredStrategy`` job: every worker trains ``STEPS`` steps (an all-reduce of the rows
each step, so the workers go in lockstep), then writes its checkpoint (the chief's to CHECKPOINT_DIR/chief);
``python tf_checkpoint_program.py resume RESULT.json SNAPSHOT CHECKPOINT GLOBAL_BATCH``: one process, another
global batch, restores the chief's checkpoint and reads the rest of the iteration. Each writes the ids its
loop received, by step, and the steps its restored epoch was said to have.
"""

import json
import sys

import tensorflow as tf

import reader

SEED, EPOCHS = 5, 2


def ids(step, strategy) -> list[int]:
    return [i for batch in strategy.experimental_local_results(step["id"]) for i in batch.numpy().tolist()]


def save(result: str, snapshot: str, directory: str, steps: int) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    dataset = reader.distributed_dataset(snapshot, 64, strategy=strategy, seed=SEED, num_epochs=EPOCHS, columns=["id"])
    data = dataset.tf_steps()
    checkpoint = tf.train.Checkpoint(data=data)
    iterator, seen = iter(data), []

    @tf.function
    def rows(step):
        return strategy.reduce("SUM", strategy.run(lambda batch: tf.shape(batch["id"])[0], args=(step,)), axis=None)

    total = 0
    for _ in range(steps):
        step = next(iterator)
        total += int(rows(step))
        seen.append(ids(step, strategy))
    task = strategy.cluster_resolver.task_id
    checkpoint.write(f"{directory}/{'chief' if task == 0 else f'worker{task}'}/ckpt")
    with open(result, "w") as file:
        json.dump({"task": task, "steps": seen, "rows_all_reduced": total}, file)


def resume(result: str, snapshot: str, checkpoint: str, global_batch: int) -> None:
    dataset = reader.distributed_dataset(snapshot, global_batch, seed=SEED, num_epochs=EPOCHS, columns=["id"])
    data = dataset.tf_steps()
    tf.train.Checkpoint(data=data).restore(checkpoint)
    left = data.steps_left_in_epoch
    steps = [step["id"].numpy().tolist() for step in data]
    with open(result, "w") as file:
        json.dump({"steps": steps, "left": left, "steps_per_epoch": dataset.steps_per_epoch}, file)


if __name__ == "__main__":
    mode, result, snapshot, where, number = sys.argv[1:6]
    (save if mode == "save" else resume)(result, snapshot, where, int(number))
