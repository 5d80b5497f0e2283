"""The window loader on its own: a block reader, an epoch order and load settings are all it needs (no pipeline)."""

import concurrent.futures
import os
import threading

import numpy as np
import pytest

import reader
from reader.core import order
from reader.core.allocator import new_batch
from reader.core.batch import BatchBuilder
from reader.core.blocks import BlockReader
from reader.core.order import EpochOrder
from reader.core.plan import InputContext, Position, ShardPolicy, assigned_pieces
from reader.core.window_cache import WindowCache
from reader.core.window_loader import LoadSettings, WindowLoader
from tests import helpers


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    path = helpers.write_snapshot(
        root, "ids", helpers.id_batches([300, 300, 400]), compression="NONE", block_size_bytes=4_000
    )
    return reader.open_snapshot(path)


@pytest.mark.parametrize(("large_rows", "shuffle"), [(False, True), (False, False), (True, True)])
def test_loaded_windows_hold_the_rows_their_order_names(snapshot, large_rows, shuffle):
    pieces = tuple(assigned_pieces(snapshot.block_rows, ShardPolicy.AUTO, InputContext())[0])
    assert len(pieces) > 4
    epoch_order = EpochOrder(pieces, window_rows=250, seed=11, shuffle=shuffle)
    source = BlockReader(snapshot, ["id"], verify_checksums=True)
    ids_of = {piece: source.read(piece)["id"] for piece in pieces}  # each piece's rows in stored order
    settings = LoadSettings(
        large_rows=large_rows, max_range_bytes=1 << 20, read_ahead_bytes=1 << 20, windows_ahead=1, open_threads=2
    )
    cache = WindowCache(ring_size=3 if shuffle else 0, capacity=400)
    with (
        concurrent.futures.ThreadPoolExecutor(2) as io_pool,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        for epoch in (0, 1):
            loader = WindowLoader(
                source, epoch_order, settings, pool, io_pool, cache.take(11, Position(epoch, 0)), None
            )
            windows, _ = loader.windows(epoch)
            assert windows == epoch_order.windows(epoch)
            for index, window in enumerate(windows):
                loaded, row_order = loader.window((epoch, index))
                stored = np.concatenate([ids_of[piece] for piece in window.pieces])
                builder = BatchBuilder(window.rows, {"id": np.empty(0, np.int64)}, pool, 1, new_batch)
                loaded.copy_into(builder, 0, row_order, 0, window.rows)
                got = builder.build()["id"]
                expected = stored if row_order is None else stored[row_order]
                np.testing.assert_array_equal(got, expected)
                assert (row_order is None) == (not shuffle)
            cache.put_back(loader.end_pass(finished=True))


def test_nothing_is_read_ahead_until_the_pass_has_its_first_window(snapshot):
    """The first window's reads (and the next window's) have the connections to themselves: read-ahead of
    further windows starts at the first step after the first window is in, so the first batch comes sooner."""
    pieces = tuple(assigned_pieces(snapshot.block_rows, ShardPolicy.AUTO, InputContext())[0])
    epoch_order = EpochOrder(pieces, window_rows=120, seed=11)
    assert len(epoch_order.windows(0)) > 3
    source = BlockReader(snapshot, ["id"], verify_checksums=False)
    settings = LoadSettings(
        large_rows=False, max_range_bytes=1 << 20, read_ahead_bytes=1 << 30, windows_ahead=1, open_threads=2
    )
    gate = threading.Event()
    with (
        concurrent.futures.ThreadPoolExecutor(1) as io_pool,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        pool.submit(gate.wait)  # the first window cannot load until the gate opens
        cache = WindowCache(ring_size=3, capacity=400)
        loader = WindowLoader(source, epoch_order, settings, pool, io_pool, cache.take(11, Position(0, 0)), None)
        first = threading.Thread(target=loader.window, args=((0, 0),))
        first.start()
        try:
            first.join(0.3)
            assert first.is_alive()  # waiting for the first window
            assert loader.read_ahead_windows == 0
        finally:
            gate.set()
            first.join(10)
        loader.window((0, 0))  # the next step
        assert loader.read_ahead_windows > 0
        cache.put_back(loader.end_pass(finished=False))


def _reader_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith(("snapfeed-io", "snapfeed-block"))}


def test_every_pass_of_a_dataset_reads_on_the_same_threads(snapshot):
    """``for epoch ...: for batch in dataset`` starts no threads after the first pass (``PassPools``), and
    the next epoch's first windows, loaded by the pass before, are read by those same threads."""
    before = _reader_threads()
    dataset = reader.distributed_dataset(snapshot.path, 100, seed=3, num_epochs=1)
    epochs, threads = [], []
    for _ in range(4):
        epochs.append(np.concatenate([batch["id"] for batch in dataset]))
        threads.append(_reader_threads() - before)
    assert all(sorted(ids) == list(range(1000)) for ids in epochs)
    assert len({tuple(ids) for ids in epochs}) == 4  # each pass its own epoch's order
    assert threads[0] and all(later == threads[0] for later in threads[1:])


def test_a_forked_process_reads_on_pools_of_its_own(snapshot, monkeypatch):
    """A pipeline that read in this process and is then forked (a DataLoader worker started after the
    trainer iterated) reads in the child on pools it makes: the parent's pool threads are not there (the
    gathering thread would run the loads it waits for itself, but nothing would read ahead). Nor does it
    wait for the loads the parent's last pass left running for the next epoch: the threads running them
    were not copied (here they are held running until the child has read its epoch)."""
    dataset = reader.distributed_dataset(snapshot.path, 100, seed=3, num_epochs=1)
    parent, release = os.getpid(), threading.Event()
    # The windows of the third epoch, whose first loads the second pass leaves running (test-only access).
    third_epoch = {window.seed for window in dataset._source._pipeline.epoch_order().windows(2)}
    row_order = order.Window.row_order

    def held_in_the_parent(window):
        if window.seed in third_epoch and os.getpid() == parent:
            release.wait(120)
        return row_order(window)

    monkeypatch.setattr(order.Window, "row_order", held_in_the_parent)
    parent_epochs = [np.concatenate([batch["id"] for batch in dataset]) for _ in range(2)]

    try:
        status, threads_in_child, got = helpers.epoch_in_forked_child(dataset, lambda: len(_reader_threads()))
    finally:
        release.set()
    assert status == 0
    assert threads_in_child > 0  # its own pools' threads (a fork copies only the forking thread)
    got = np.array(got)
    assert sorted(got.tolist()) == list(range(1000))
    assert not any(np.array_equal(got, epoch) for epoch in parent_epochs)  # the third epoch, not a replay


def test_a_process_forked_while_a_reader_thread_opens_a_shard_opens_it_itself(snapshot):
    """A fork copies only the forking thread: a lock a reader thread held at that moment (here the
    lock a shard is opened under, held by a thread of this process) is new and unheld in the child,
    which opens the shard and reads its epoch instead of hanging on it."""
    dataset = reader.distributed_dataset(snapshot.path, 100, seed=3, num_epochs=1)
    opening, release = threading.Event(), threading.Event()

    def open_in_progress():  # test-only access: what a thread opening shard 0 holds
        with dataset._source._pipeline.source._files.lock(0):
            opening.set()
            release.wait(120)

    holder = threading.Thread(target=open_in_progress)
    holder.start()
    opening.wait(10)
    try:
        status, _, got = helpers.epoch_in_forked_child(dataset)
    finally:
        release.set()
        holder.join()
    assert status == 0
    assert sorted(got) == list(range(1000))
