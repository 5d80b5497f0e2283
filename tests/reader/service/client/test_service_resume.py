"""Service reads resume from get_state() in a new process, and feed tf.distribute like local reads."""

import collections
import concurrent.futures
import json
import logging
import subprocess
import sys

import numpy as np
import pytest

import reader
from reader.service import DispatcherConfig, DispatchServer, splits
from reader.service.client import connection
from tests import helpers
from tests.reader.service.probes import with_two_workers

RESTORE_SCRIPT = r"""
import json, sys
import reader
path, target = sys.argv[1], sys.argv[2]
out = {}
for job_name, state in json.load(sys.stdin):
    service = reader.ServiceOptions(address=target, job_name=job_name)
    dataset = reader.distributed_dataset(path, 64, num_replicas=2, num_epochs=2, seed=7, service=service)
    iterator = iter(dataset)
    iterator.set_state(state)
    out[job_name] = [[b["id"].tolist() for b in step] for step in iterator]
print(json.dumps(out))
"""


def ids(step):
    return [batch["id"].tolist() for batch in step]


def service_dataset(path, target, job_name, processing_mode="distributed_epoch", **kwargs):
    options = {"num_replicas": 2, "num_epochs": 2, "seed": 7, **kwargs}
    service = reader.ServiceOptions(address=target, processing_mode=processing_mode, job_name=job_name)
    return reader.distributed_dataset(path, 64, **options, service=service)


def test_distributed_epoch_resumes_exactly_in_a_new_process(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    uninterrupted = [ids(step) for step in service_dataset(uneven_snapshot, dispatcher.target, "whole")]
    assert len(uninterrupted) == 2 * 32  # 2000 rows, global batch 64: 31 full steps + 1 partial per epoch
    saved = []
    for k in (0, 1, 7, 31, 32, 45):
        job_name = f"resumed-{k}"
        iterator = iter(service_dataset(uneven_snapshot, dispatcher.target, job_name))
        for _ in range(k):
            next(iterator)
        saved.append((job_name, json.loads(json.dumps(iterator.get_state()))))
        iterator.close()  # the consumer "dies" here holding leases; the restored one re-claims them
    completed = subprocess.run(
        [sys.executable, "-c", RESTORE_SCRIPT, str(uneven_snapshot), dispatcher.target],
        input=json.dumps(saved),
        capture_output=True,
        text=True,
        env=helpers.cli_env(),
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    rest = json.loads(completed.stdout)
    for job_name, _ in saved:
        k = int(job_name.split("-")[1])
        assert rest[job_name] == uninterrupted[k:], f"resuming after {k} steps"


def test_a_restore_after_reading_past_the_checkpoint_delivers_those_rows_again(cluster, uneven_snapshot):
    """Training restarts from its checkpoint: the steps read after it (and acknowledged) come again."""
    dispatcher, _ = cluster
    iterator = iter(service_dataset(uneven_snapshot, dispatcher.target, "rewind", num_epochs=1))
    before = [ids(next(iterator)) for _ in range(5)]
    state = iterator.get_state()
    lost = [ids(next(iterator)) for _ in range(10)]  # read after the checkpoint, then the trainer crashed
    iterator.close()
    restored = iter(service_dataset(uneven_snapshot, dispatcher.target, "rewind", num_epochs=1))
    restored.set_state(state)
    after = [ids(step) for step in restored]
    assert after[:10] == lost
    rows = collections.Counter(i for step in before + after for batch in step for i in batch)
    assert rows == {i: 1 for i in range(2000)}


def test_one_consumers_state_resumes_a_job_whose_consumers_all_stopped_on_more_consumers(
    cluster, uneven_snapshot, caplog
):
    """A synchronous trainer's two input pipelines read 4 steps, the chief saved its state, both read 3 more and
    stopped (their leases lapse); three pipelines restored from the chief's state deliver the rest exactly once
    against the checkpoint (the 3 steps after it again), and the next epoch whole. Processes, kill -9 and a
    dispatcher restart: test_service_restart.py (slow)."""
    dispatcher, _ = cluster
    crashed = [iter(service_dataset(uneven_snapshot, dispatcher.target, "sync")) for _ in range(2)]
    before = [ids(next(iterator)) for _ in range(4) for iterator in crashed]
    state = json.loads(json.dumps(crashed[0].get_state()))
    after = [ids(next(iterator)) for _ in range(3) for iterator in crashed]
    for iterator in crashed:
        iterator.close()

    def restored(_) -> list:
        iterator = iter(service_dataset(uneven_snapshot, dispatcher.target, "sync"))
        iterator.set_state(state)
        return [(iterator.get_state()["epoch"], ids(step)) for step in iterator]

    with caplog.at_level(logging.WARNING, logger=connection.__name__), concurrent.futures.ThreadPoolExecutor(3) as pool:
        resumed = [step for steps in pool.map(restored, range(3)) for step in steps]
    waited = [
        r.getMessage() for r in caplog.records if "waiting (restoring job 'sync': waiting up to" in r.getMessage()
    ]
    assert waited, "the restore waited for the stopped consumers' leases to lapse, and said so"
    rows = collections.Counter(i for step in before for batch in step for i in batch)
    rows.update(i for epoch, step in resumed if epoch == 0 for batch in step for i in batch)
    assert rows == {i: 1 for i in range(2000)}
    assert {i for step in after for batch in step for i in batch} <= set(rows), "delivered again"
    next_epoch = collections.Counter(i for epoch, step in resumed if epoch == 1 for batch in step for i in batch)
    assert next_epoch == {i: 1 for i in range(2000)}


def test_a_state_the_dispatcher_has_no_record_of_is_refused_in_one_line(cluster, uneven_snapshot):
    """A dispatcher whose --work_dir was lost cannot tell which rows the state's epoch delivered."""
    dispatcher, _ = cluster
    iterator = iter(service_dataset(uneven_snapshot, dispatcher.target, "lost"))
    next(iterator)
    state = iterator.get_state()
    iterator.close()
    other = DispatchServer(DispatcherConfig(lease_seconds=2)).start()
    with with_two_workers(other):
        restored = iter(service_dataset(uneven_snapshot, other.target, "lost"))
        restored.set_state(state)
        with pytest.raises(reader.UsageError) as refused:
            next(restored)
    message = str(refused.value).splitlines()[0]
    assert "has no record of consumer" in message and "--work_dir was lost" in message, message
    assert message.endswith("or read the epoch anew under another job_name")


def test_parallel_epochs_resume_each_worker_stream_where_it_stopped(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    dataset = service_dataset(
        uneven_snapshot, dispatcher.target, "par", processing_mode="parallel_epochs", num_epochs=1
    )
    iterator = iter(dataset)
    before = [ids(next(iterator)) for _ in range(9)]
    state = json.loads(json.dumps(iterator.get_state()))
    iterator.close()
    restored = iter(
        service_dataset(uneven_snapshot, dispatcher.target, "par", processing_mode="parallel_epochs", num_epochs=1)
    )
    restored.set_state(state)
    rows = collections.Counter(i for step in before + [ids(s) for s in restored] for batch in step for i in batch)
    assert rows == {i: 2 for i in range(2000)}, "each row once per worker, none repeated or skipped"


def test_a_state_from_other_options_or_a_local_reader_is_refused(cluster, uneven_snapshot):
    dispatcher, _ = cluster
    state = iter(service_dataset(uneven_snapshot, dispatcher.target, "a")).get_state()
    other = iter(reader.distributed_dataset(uneven_snapshot, 32, service=dispatcher.target))
    with pytest.raises(reader.UsageError, match="same arguments"):
        other.set_state(state)
    with pytest.raises(reader.UsageError, match="reader-service state"):
        other.set_state(iter(reader.distributed_dataset(uneven_snapshot, 64)).get_state())


def test_a_distributed_state_of_a_version_with_other_splits_is_refused(cluster, uneven_snapshot, monkeypatch):
    """Its rows are counted per split: with splits of other blocks they would be other rows."""
    dispatcher, _ = cluster
    state = iter(service_dataset(uneven_snapshot, dispatcher.target, "splits")).get_state()
    monkeypatch.setattr(splits, "BLOCKS_PER_SPLIT", splits.BLOCKS_PER_SPLIT // 2)
    with pytest.raises(reader.UsageError, match=r"blocks per split \(snapfeed version\)"):
        iter(service_dataset(uneven_snapshot, dispatcher.target, "splits")).set_state(state)


tf = pytest.importorskip("tensorflow")


def test_strategy_run_over_service_batches_with_partial_steps(cluster, range_root, strategy):
    dispatcher, _ = cluster
    dataset = reader.distributed_dataset(range_root / "range6", 4, strategy=strategy, service=dispatcher.target)

    @tf.function
    def step_fn(batch):
        return strategy.run(lambda b: b["id"] * 1, args=(batch,))

    per_step = [[t.numpy().tolist() for t in strategy.experimental_local_results(step_fn(b))] for b in dataset]
    assert [[len(replica) for replica in step] for step in per_step] == [[2, 2], [1, 1]]
    assert sorted(i for step in per_step for replica in step for i in replica) == list(range(6))


def test_keras_fit_through_the_service_with_a_strategy(cluster, uneven_snapshot, strategy):
    dispatcher, _ = cluster

    def features_and_target(batch):
        return {"value": batch["value"]}, batch["value"] / 500.0 + 1.0

    dataset = reader.distributed_dataset(
        uneven_snapshot, 64, strategy=strategy, seed=4, map_fn=features_and_target, service=dispatcher.target
    )
    with strategy.scope():
        inputs = {"value": tf.keras.Input(shape=(), name="value")}
        scaled = tf.keras.layers.Rescaling(1 / 1000)(tf.keras.layers.Reshape((1,))(inputs["value"]))
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(scaled))
        model.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="mse")
    losses = model.fit(dataset.tf_dataset, epochs=3, verbose=0).history["loss"]
    assert len(losses) == 3 and np.all(np.isfinite(losses)) and losses[-1] < losses[0]
