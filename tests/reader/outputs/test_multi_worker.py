"""Keras ``fit`` under ``MultiWorkerMirroredStrategy``: two worker processes on 127.0.0.1.

Each worker (tests/reader/outputs/multi_worker_fit.py) reads with ``strategy=`` and AUTO sharding:
tf.distribute hands ``dataset_fn`` the worker's input context (pipeline = task index of 2), so the
workers read disjoint contiguous halves of the snapshot and take the same number of steps.
"""

import json
import math
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import reader
from testing.ports import free_ports
from tests import helpers

pytest.importorskip("tensorflow")

GLOBAL_BATCH, EPOCHS = 64, 2
WORKER_PROGRAM = pathlib.Path(__file__).with_name("multi_worker_fit.py")
WORKER_TIMEOUT_S = 300
#: Rows per snapshot: a partial last step, a row count the global batch divides, and one where the
#: last step holds a single row (one worker's last batch is empty).
ROWS = {"partial": 1000, "even": 1024, "one_row_last_step": 1025}


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi_worker")
    return {
        name: helpers.write_snapshot(root, name, helpers.id_batches([rows // 4] * 3 + [rows - 3 * (rows // 4)]))
        for name, rows in ROWS.items()
    }


def wait_until_done_or_one_fails(processes: list[subprocess.Popen], deadline: float) -> None:
    """A failed worker leaves the other waiting on a collective forever: stop waiting at the first failure."""
    while time.monotonic() < deadline:
        codes = [process.poll() for process in processes]
        if all(code == 0 for code in codes) or any(code not in (None, 0) for code in codes):
            return
        time.sleep(0.2)


def run_workers(tmp_path, shard_policy: str, paths: list[str]) -> list[dict]:
    """Runs the two workers to completion (both killed after WORKER_TIMEOUT_S or one's failure); results by task."""
    run_cluster(
        tmp_path, lambda index: [str(WORKER_PROGRAM), str(tmp_path / f"worker{index}.json"), shard_policy, *paths]
    )
    results = [json.loads((tmp_path / f"worker{index}.json").read_text()) for index in range(2)]
    assert [result["task"] for result in results] == [0, 1]
    return [result["results"] for result in results]


def run_cluster(tmp_path, arguments) -> None:
    """``python *arguments(index)`` as worker ``index`` of a two-worker cluster (``TF_CONFIG``), to completion
    (both killed after WORKER_TIMEOUT_S or one's failure); a failed worker fails the test with its log."""
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    workers = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        command = [sys.executable, *arguments(index)]
        with open(tmp_path / f"worker{index}.log", "w") as log:  # the worker keeps its own copy open
            env = helpers.cli_env(TF_CONFIG=tf_config)
            workers.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        wait_until_done_or_one_fails(workers, time.monotonic() + WORKER_TIMEOUT_S)
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
                process.wait()
    for index, process in enumerate(workers):
        tail = (tmp_path / f"worker{index}.log").read_text()[-4000:]
        assert process.returncode == 0, f"worker {index} exited with {process.returncode}:\n{tail}"


def assert_fit_read_every_row_once_per_epoch(per_worker: list[dict], rows: int, steps: int, name: str) -> None:
    """Both workers ran and showed ``steps`` per epoch, and their steps of each epoch hold every row once."""
    for task, worker in enumerate(per_worker):
        assert worker["steps_per_epoch"] == steps, (name, task)
        assert worker["shown"] == worker["ran"] == [steps] * EPOCHS, (name, task, worker["shown"], worker["ran"])
        assert worker["warnings"] == [], (name, task)
        assert len(worker["consumed"]) == steps * EPOCHS, (name, task)
        assert np.all(np.isfinite(worker["losses"])), (name, task, worker["losses"])
    for epoch in range(EPOCHS):
        epoch_steps = slice(epoch * steps, (epoch + 1) * steps)
        ids = sorted(i for worker in per_worker for batch in worker["consumed"][epoch_steps] for i in batch)
        assert ids == list(range(rows)), f"{name}: epoch {epoch} did not read every row once"
    assert per_worker[0]["losses"] == per_worker[1]["losses"], name  # one synchronized model


def test_fit_runs_steps_per_epoch_and_reads_every_row_once_per_epoch(snapshots, tmp_path):
    results = run_workers(tmp_path, "AUTO", list(snapshots.values()))
    for name, path in snapshots.items():
        per_worker = [worker[path] for worker in results]
        assert_fit_read_every_row_once_per_epoch(per_worker, ROWS[name], math.ceil(ROWS[name] / GLOBAL_BATCH), name)
        for task, worker in enumerate(per_worker):  # AUTO: worker `task` reads the task-th contiguous half
            half = range(ROWS[name] * task // 2, ROWS[name] * (task + 1) // 2)
            assert {i for batch in worker["consumed"] for i in batch} == set(half), (name, task)


@pytest.mark.slow
def test_file_sharding_steps_per_epoch_are_the_workers(tmp_path):
    """FILE gives one worker more than half the rows: an epoch takes more steps than one pipeline's."""
    path = helpers.write_snapshot(
        tmp_path, "shards", helpers.id_batches([1000]), block_size_bytes=1800, shard_size_bytes=12_000
    )
    context = reader.InputContext(2, 0, 2)
    steps = reader.distributed_dataset(path, GLOBAL_BATCH, input_context=context, shard_policy="FILE").steps_per_epoch
    assert steps > math.ceil(1000 / GLOBAL_BATCH)
    per_worker = [worker[path] for worker in run_workers(tmp_path, "FILE", [path])]
    assert_fit_read_every_row_once_per_epoch(per_worker, 1000, steps, "FILE")
