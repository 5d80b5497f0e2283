"""``iterator.stats()``: rows, bytes and how long the training loop waited for input, checked against a loop that
sleeps a known time per step; local reads, prefetched device steps, a restore, and the reader service."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

import reader
from reader.core.stats import InputStats, StepClock

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
        steps = _train(iterator)
    stats = iterator.stats()
    assert stats.steps == len(steps) == dataset.steps_per_epoch == 20
    assert stats.rows == 2000 and stats.bytes == _bytes(uneven_snapshot, columns)
    assert stats.elsewhere_seconds >= (len(steps) - 1) * STEP_SECONDS, "the sleeps between steps"
    assert stats.wait_seconds + stats.elsewhere_seconds == pytest.approx(stats.seconds, rel=1e-6)
    assert stats.input_bound_fraction < 0.5, stats
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("snapfeed input: ")]
    assert line.startswith("snapfeed input: 20 steps, 2000 rows"), line


def test_prefetched_device_steps_are_counted_once_as_delivered_across_a_restore(uneven_snapshot):
    pytest.importorskip("torch")
    dataset = reader.distributed_dataset(
        uneven_snapshot, 100, seed=3, columns=["id"], output="torch", device="cpu", prefetch_to_device=3
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
