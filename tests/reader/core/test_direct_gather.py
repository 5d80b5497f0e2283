"""Uncompressed shards are read straight into windows and batches: same rows and order as decoded reads."""

import os
import subprocess
import sys

import numpy as np
import pytest

import reader
from reader.core.blocks import BlockReader
from reader.core.options import LARGE_ROW_BYTES
from reader.core.plan import ShardPolicy, assigned_pieces
from schemas.errors import CorruptSnapshotError
from tests import helpers

BLOCK_ROWS = 5


def payload_table(rows: int, width: int, *, zero_groups: bool = False) -> np.ndarray:
    """Incompressible bytes per id; with ``zero_groups`` ids 0-59 of every 180 are all zeros."""
    table = np.random.default_rng(7).integers(0, 256, (rows, width), dtype=np.uint8)
    if zero_groups:
        for start in range(0, rows, 180):
            table[start : start + 60] = 0
    return table


def batches_of(table: np.ndarray) -> list[dict[str, np.ndarray]]:
    ids = np.arange(len(table), dtype=np.int64)
    return [
        {"id": ids[s : s + 80], "payload": table[s : s + 80], "value": (ids[s : s + 80] * 0.5).astype(np.float32)}
        for s in range(0, len(table), 80)
    ]


@pytest.fixture(scope="module", params=[3072, 40_960], ids=["3KB-rows", "40KB-rows"])
def snapshots(request, tmp_path_factory):
    """The same rows stored uncompressed and with LZ4 (one shard each), and over many shards (AUTO)."""
    width = request.param
    rows = 1200 if width < 10_000 else 240
    root = tmp_path_factory.mktemp(f"direct{width}")
    table = payload_table(rows, width)
    block = width * BLOCK_ROWS
    one_shard = {"block_size_bytes": block, "shard_size_bytes": 1 << 30}
    mixed_table = payload_table(rows, width, zero_groups=True)
    return {
        "table": table,
        "none": helpers.write_snapshot(root, "none", batches_of(table), compression="NONE", **one_shard),
        "lz4": helpers.write_snapshot(root, "lz4", batches_of(table), compression="LZ4", **one_shard),
        "many": helpers.write_snapshot(
            root, "many", batches_of(table), block_size_bytes=block, shard_size_bytes=block * 12
        ),
        "mixed_table": mixed_table,
        "mixed": helpers.write_snapshot(
            root, "mixed", batches_of(mixed_table), block_size_bytes=block, shard_size_bytes=block * 12
        ),
    }


def steps(path, **options) -> list:
    return list(reader.distributed_dataset(path, 64, **options))


def rows_of(steps_: list) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([s["id"] for s in steps_]), np.concatenate([s["payload"] for s in steps_])


def direct_window(path: str):
    snapshot = reader.open_snapshot(path)
    pieces = assigned_pieces(snapshot.block_rows, ShardPolicy.OFF, reader.InputContext())[0]
    return BlockReader(snapshot, ["id", "payload"], verify_checksums=False).direct_window(pieces)


def test_only_uncompressed_shards_are_gathered_directly(snapshots):
    assert direct_window(snapshots["none"]) is not None
    assert direct_window(snapshots["lz4"]) is None
    many = reader.open_snapshot(snapshots["many"])
    assert many.num_shards > 3 and {s.compression for s in many.metadata.shards} == {"none"}, "AUTO: random bytes"
    assert direct_window(snapshots["many"]) is not None


@pytest.mark.parametrize(
    "options",
    [
        {"seed": 3, "num_epochs": 2},
        {"shuffle": False},
        {"seed": 3, "num_replicas": 3},
        {"seed": 3, "columns": ["payload", "id"]},
        {"seed": 3, "shuffle_buffer_size": 37, "drop_remainder": True},
    ],
    ids=["shuffled", "in-order", "replicas", "projected", "small-window"],
)
def test_direct_gathers_give_the_steps_of_decoded_reads(snapshots, options):
    none, lz4 = reader.open_snapshot(snapshots["none"]), reader.open_snapshot(snapshots["lz4"])
    assert none.block_rows == lz4.block_rows, "same blocks, so the same plan and order"
    direct, decoded = steps(none, **options), steps(lz4, **options)
    assert len(direct) == len(decoded) > 1
    for ours, theirs in zip(direct, decoded, strict=True):
        for replica, expected in zip(
            ours if isinstance(ours, list) else [ours], theirs if isinstance(theirs, list) else [theirs], strict=True
        ):
            assert replica.keys() == expected.keys()
            for name, values in expected.items():
                assert replica[name].dtype == values.dtype and replica[name].shape == values.shape
                np.testing.assert_array_equal(replica[name], values)


@pytest.mark.parametrize("name", ["many", "mixed"])
def test_rows_of_many_shards_are_gathered_intact_and_once_per_epoch(snapshots, name):
    snapshot = reader.open_snapshot(snapshots[name])
    table = snapshots["table" if name == "many" else "mixed_table"]
    if name == "mixed":
        codecs = [shard.compression for shard in snapshot.metadata.shards]
        assert {"lz4", "none"} <= set(codecs), f"AUTO should pick per shard: {codecs}"
    ids, payload = rows_of(steps(snapshot, seed=5, num_epochs=2, shuffle_buffer_size=150))
    np.testing.assert_array_equal(payload, table[ids])
    assert sorted(ids.tolist()) == sorted(list(range(len(table))) * 2)
    first_epoch = ids[: len(table)]
    assert np.mean(np.abs(np.diff(first_epoch)) == 1) < 0.1, "shuffled across shards"


@pytest.mark.parametrize("cores", [16, 64, 2])
def test_auto_block_threads_follow_the_row_size(snapshots, monkeypatch, cores):
    """AUTO ``num_reader_threads``: a core each but one, at most 2 for small rows (one gathering thread
    bounds them; more block threads only pass the GIL around) and at most 16 for large ones (each read
    by its own ``preadv`` straight into the batch, so the copies run on as many cores as threads)."""
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    large = snapshots["table"].shape[1] >= LARGE_ROW_BYTES
    expected = min(cores - 1, 16 if large else 2)
    auto = reader.distributed_dataset(snapshots["none"], 64, seed=1)
    given = reader.distributed_dataset(snapshots["none"], 64, seed=1, read=reader.ReadOptions(num_reader_threads=3))
    for dataset, threads in [(auto, expected), (given, 3)]:
        pipeline = dataset._source._pipeline  # test-only access: the pool the pipeline reads on
        assert pipeline.block_threads == threads
        assert pipeline._pools.get()[1]._max_workers == threads
    ids, payload = rows_of(list(auto))
    np.testing.assert_array_equal(payload, snapshots["table"][ids])


def test_small_rows_of_uncompressed_shards_skip_arrow_decoding(snapshots, monkeypatch):
    """Windows of uncompressed shards are filled by positioned reads, never through Arrow's decoder."""

    def decoding(self, piece, *args, **kwargs):
        raise AssertionError(f"{piece} was decoded by Arrow")

    expected = steps(reader.open_snapshot(snapshots["none"]), seed=4)
    monkeypatch.setattr(BlockReader, "read", decoding)
    direct = steps(reader.open_snapshot(snapshots["none"]), seed=4)
    assert len(direct) == len(expected) > 1
    for ours, theirs in zip(direct, expected, strict=True):
        np.testing.assert_array_equal(ours["payload"], theirs["payload"])
    with pytest.raises(AssertionError, match="decoded by Arrow"):
        steps(reader.open_snapshot(snapshots["lz4"]), seed=4)


@pytest.mark.parametrize("width", [3072, 40_960], ids=["3KB-rows", "40KB-rows"])
def test_a_shard_cut_short_under_a_running_reader_is_named(tmp_path, width):
    """Rows are read with preadv (into the window, or into the batch for large rows), so a shard
    truncated after it was opened is an error naming it, never a crash."""
    rows = 160 if width > 10_000 else 1200
    path = helpers.write_snapshot(
        tmp_path, "cut", batches_of(payload_table(rows, width)), compression="NONE", block_size_bytes=width * 20
    )
    snapshot = reader.open_snapshot(path)
    dataset = reader.distributed_dataset(
        snapshot, 16, seed=1, num_epochs=4, shuffle_buffer_size=60, read=reader.ReadOptions(prefetch=1)
    )
    iterator = iter(dataset)
    next(iterator)
    shard = snapshot.shard_path(0)
    os.truncate(shard, os.path.getsize(shard) // 2)
    with pytest.raises(CorruptSnapshotError, match=f"shard {shard} ends at byte .*snapfeed verify"):
        for _ in iterator:
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
@pytest.mark.parametrize(("setting", "expected"), [("1", "True"), ("0", "False")])
def test_malloc_tuning_is_applied_unless_turned_off(setting, expected):
    completed = subprocess.run(
        [sys.executable, "-c", "from reader.core import allocator; print(allocator.keep_freed_batches())"],
        env={**os.environ, "SNAPFEED_TUNE_MALLOC": setting},
        capture_output=True,
        text=True,
        check=True,
    )
    assert completed.stdout.strip() == expected
