"""Large shuffled gathers shared with helper threads (``BatchBuilder.take``) write the same batches."""

import concurrent.futures
import threading
import time

import numpy as np
import pytest

import reader
from reader.core import batch as batch_module
from reader.core.options import ReaderOptions
from reader.core.pipeline import ReadPipeline
from reader.core.plan import Position


def _epochs(snapshot, helpers: int, shuffle: bool = True):
    pipeline = ReadPipeline(
        snapshot,
        ReaderOptions(global_batch_size=96, seed=11, num_epochs=2, shuffle=shuffle, gather_helpers=helpers),
    )
    return [
        {name: values.copy() for name, values in batches[0].items()} for _, batches in pipeline.steps(Position(0, 0), 2)
    ]


def test_shares_on_helpers_gather_every_row_into_its_slot(wide_snapshot, monkeypatch):
    snapshot = reader.open_snapshot(wide_snapshot)
    alone = _epochs(snapshot, helpers=0)
    monkeypatch.setattr(batch_module, "SHARE_BYTES", 16 << 10)  # a step of 96 rows of 2 KB: 4 shares
    helped_by = set()
    take_rows = batch_module.take_rows

    def noted(values, positions, out):
        helped_by.add(threading.current_thread().name.split("_")[0])
        take_rows(values, positions, out)

    monkeypatch.setattr(batch_module, "take_rows", noted)
    shared = _epochs(snapshot, helpers=3)
    assert len(shared) == len(alone)
    for ours, theirs in zip(shared, alone, strict=True):
        assert ours.keys() == theirs.keys()
        for name in ours:
            np.testing.assert_array_equal(ours[name], theirs[name])
    ids = np.concatenate([step["id"] for step in shared])
    assert sorted(ids.tolist()) == sorted(list(range(len(ids) // 2)) * 2)  # every row once an epoch
    if "payload" in shared[0] and shared[0]["payload"].shape[1] < 10_000:  # gathered by take, not row by row
        assert "snapfeed-gather" in helped_by


def test_a_failed_share_fails_the_step_once_no_share_still_writes(monkeypatch):
    monkeypatch.setattr(batch_module, "SHARE_BYTES", 1_000_000)  # 3,072,000 bytes: shares of 1000 rows
    helpers = batch_module.GatherHelpers(concurrent.futures.ThreadPoolExecutor(2, "snapfeed-gather"), 2)
    builder = batch_module.BatchBuilder(
        3000,
        {"x": np.empty((0, 1024), np.uint8)},
        None,
        1,
        lambda rows, empty: {"x": np.zeros((rows, 1024), np.uint8)},
        helpers,
    )
    columns = {"x": np.arange(3000 * 1024, dtype=np.int64).astype(np.uint8).reshape(3000, 1024)}
    finished = []
    take_rows = batch_module.take_rows

    def failing(values, positions, out):
        if not threading.current_thread().name.startswith("snapfeed-gather"):
            raise MemoryError("share failed")
        time.sleep(0.2)  # the helpers' shares end well after the calling thread's failed
        take_rows(values, positions, out)
        finished.append(positions[0])

    monkeypatch.setattr(batch_module, "take_rows", failing)
    with pytest.raises(MemoryError, match="share failed"):
        builder.take(columns, np.arange(3000), builder.segment(0, 3000))
    assert sorted(finished) == [1000, 2000]  # no share still writes once the error reaches the step
