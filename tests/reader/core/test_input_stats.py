"""``iterator.stats()``: rows, bytes and how long the training loop waited for input, checked against a loop that
sleeps a known time per step; local reads, prefetched device steps, a restore, and the reader service."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import pathlib
import threading
import time

import numpy as np
import pytest

import reader
from reader.core.loading import Loading
from reader.core.stats import InputStats, ReaderClock, ReaderSeconds, StepClock, TimedPool
from tests.object_store_fixtures import ObjectStore

STEP_SECONDS = 0.02


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_clock_splits_waiting_from_the_rest():
    clock = FakeClock()
    steps = StepClock(clock)
    since = steps.waiting()
    clock.now += 0.5  # the first step takes 0.5 s to come
    steps.delivered(since, rows=100, num_bytes=4000)
    clock.now += 2.0  # the training step
    since = steps.waiting()
    clock.now += 0.1
    steps.delivered(since, rows=50, num_bytes=2000)
    clock.now += 1.0
    since = steps.waiting()
    clock.now += 0.4  # the end of the epoch is found
    steps.ended(since)
    clock.now += 60  # after the loop: not counted
    stats = steps.stats()
    assert stats == InputStats(
        steps=2,
        rows=150,
        bytes=6000,
        seconds=pytest.approx(4.0),
        wait_seconds=pytest.approx(1.0),
        elsewhere_seconds=pytest.approx(3.0),
    )
    assert stats.input_bound_fraction == pytest.approx(0.25) and stats.rows_per_second == pytest.approx(37.5)
    assert str(stats) == (
        "2 steps, 150 rows (0.0 MB) in 4.0 s: 38 rows/s, 0.0 MB/s; waited 1.00 s for input, 3.00 s elsewhere: "
        "25% input-bound"
    )
    assert StepClock().stats() == InputStats(), "nothing read, nothing to say"


def test_pool_tasks_count_their_busy_seconds_to_their_stage_summed_over_threads():
    clock = ReaderClock()
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        reads = TimedPool(pool, clock, "storage_reads")
        started = time.perf_counter()
        assert list(reads.map(lambda seconds: time.sleep(seconds) or seconds, [0.1] * 3)) == [0.1] * 3
        wall = time.perf_counter() - started
        reads.submit(lambda: None).result()
    seconds = clock.seconds()
    assert seconds.storage_reads >= 0.3 > wall, "three threads busy 0.1 s each, at once"
    assert dataclasses.replace(seconds, storage_reads=0.0) == ReaderSeconds(), "no other stage was timed"
    assert str(ReaderSeconds(storage_reads=1.5, convert=0.25)) == "storage reads 1.50 s, convert 0.25 s"


def test_reads_a_loading_runs_itself_count_to_their_pools_stage():
    """The gatherer runs the reads of a window no pool thread has started (``Loading.result``): decode work,
    timed as the pool's tasks are, not lost between the stages."""
    clock = ReaderClock()
    release = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(release.wait)  # the pool's one thread is busy: the loading's reads stay queued
        loading = Loading(TimedPool(pool, clock, "decode"), [lambda: time.sleep(0.05) or 1] * 2, sum)
        assert loading.result() == 2 and loading.done
        release.set()
    assert clock.seconds().decode >= 0.1


def _train(iterator, steps: int | None = None) -> list:
    """A training loop whose step takes STEP_SECONDS; ``steps`` of them, or to the end."""
    seen = []
    for step in iterator:
        seen.append(step)
        time.sleep(STEP_SECONDS)
        if steps is not None and len(seen) == steps:
            break
    return seen


def _bytes(path, columns) -> int:
    snapshot = reader.open_snapshot(path)
    batch = next(iter(reader.distributed_dataset(path, snapshot.num_rows, shuffle=False, columns=columns)))
    return sum(values.nbytes for values in batch.values())


def test_a_local_epoch_reports_its_rows_bytes_and_a_model_bound_loop(uneven_snapshot, caplog):
    columns = ["id", "value"]
    dataset = reader.distributed_dataset(uneven_snapshot, 100, seed=3, columns=columns)
    iterator = iter(dataset)
    with caplog.at_level(logging.INFO, logger="reader"):
        steps = _train(iterator, steps=1)
        started = iterator.stats()  # the first step waited for the pipeline to start (seconds on a busy machine)
        steps += _train(iterator)
    stats = iterator.stats()
    assert stats.steps == len(steps) == dataset.steps_per_epoch == 20
    assert stats.rows == 2000 and stats.bytes == _bytes(uneven_snapshot, columns)
    assert stats.elsewhere_seconds >= (len(steps) - 1) * STEP_SECONDS, "the sleeps between steps"
    assert stats.wait_seconds + stats.elsewhere_seconds == pytest.approx(stats.seconds, rel=1e-6)
    running = stats.minus(started)
    assert running.steps == 19 and running.input_bound_fraction < 0.5, running  # the loop sets the pace
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("snapfeed input")]
    assert line.startswith("snapfeed input, epoch 0: 20 steps, 2000 rows"), line
    assert "; reader busy: " in line, line


def test_a_line_per_epoch_counts_that_epoch_only(uneven_snapshot, caplog):
    dataset = reader.distributed_dataset(uneven_snapshot, 100, seed=3, columns=["id"], num_epochs=3)
    iterator = iter(dataset)
    with caplog.at_level(logging.INFO, logger="reader"):
        steps = _train(iterator)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("snapfeed input")]
    assert len(steps) == 60 and [line.split(" rows")[0] for line in lines] == [
        f"snapfeed input, epoch {epoch}: 20 steps, 2000" for epoch in range(3)
    ], lines


def test_prefetched_device_steps_are_counted_once_as_delivered_across_a_restore(uneven_snapshot):
    pytest.importorskip("torch")
    dataset = reader.distributed_dataset(
        uneven_snapshot,
        100,
        seed=3,
        columns=["id"],
        output="torch",
        placement=reader.PlacementOptions(device="cpu", prefetch_to_device=3),
    )
    iterator = iter(dataset)
    first = _train(iterator, steps=5)
    state = iterator.get_state()
    iterator.close()  # up to 3 steps made ahead are dropped, and read again after the restore
    iterator.set_state(state)
    rest = _train(iterator)
    stats = iterator.stats()
    ids = np.concatenate([step["id"].numpy() for step in first + rest])
    assert sorted(ids.tolist()) == list(range(2000))
    assert (stats.steps, stats.rows, stats.bytes) == (20, 2000, 2000 * 8)


def test_the_reader_says_where_its_own_time_went(uneven_snapshot):
    """A map_fn taking 10 ms a step is the conversion's time; warm blocks are copied into windows on the block
    threads and gathered into batches; nothing waited for storage or was received from a service."""

    def slow_map(batch):
        time.sleep(0.01)
        return batch

    iterator = iter(reader.distributed_dataset(uneven_snapshot, 100, seed=3, map_fn=slow_map))
    steps = _train(iterator)
    busy = iterator.stats().reader
    assert len(steps) * 0.01 <= busy.convert
    assert busy.decode > 0 and busy.gather > 0 and busy.receive == 0, busy


def test_blocks_fetched_from_a_bucket_are_storage_reads(uneven_snapshot, s3_emulator, s3_bucket):
    """Every block of a snapshot in a bucket (moto's S3) is fetched by ranged GETs on the I/O threads."""
    root = ObjectStore("s3", s3_bucket, s3_emulator, pathlib.Path(uneven_snapshot)).copy_in(uneven_snapshot)
    iterator = iter(reader.distributed_dataset(root, 100, seed=3))
    assert sum(len(step["id"]) for step in iterator) == 2000
    busy = iterator.stats().reader
    assert busy.storage_reads > 0 and busy.decode > 0, busy
