"""Opening snapshots, pending/failed/corrupt ones, and every bad argument: clear errors."""

import json
import pathlib
import re
import shutil
import subprocess
import threading
import time
from functools import partial

import pyarrow as pa
import pytest

import reader
from beam_jobs.writing import commit
from reader.core import block_io
from schemas import writer_process
from schemas.errors import StorageError
from tests.golden.make_golden import ROOT as GOLDEN_ROOT


@pytest.fixture
def copy_of(tmp_path):
    def copy(snapshot_dir, name="copy"):
        target = tmp_path / "root" / name
        shutil.copytree(snapshot_dir, target)
        return target

    return copy


def first_shard(snapshot_dir: pathlib.Path) -> pathlib.Path:
    return next(snapshot_dir.glob("run-*/shard-*.arrow"))


def test_open_snapshot_by_root_by_directory_and_by_name(range_root):
    with pytest.raises(reader.UsageError) as error:
        reader.open_snapshot(range_root)
    assert "5 finalized snapshots" in str(error.value) and "range12" in str(error.value)
    by_name = reader.open_snapshot(range_root, snapshot_name="range6")
    by_dir = reader.open_snapshot(range_root / "range6")
    assert by_name.path == by_dir.path and by_name.num_rows == 6 and by_dir.num_shards == 1
    assert by_name.schema.names == ["id", "image", "value"]
    assert by_name.verify() == 1


def test_distributed_dataset_chooses_by_name_or_id_as_its_error_says(range_root):
    with pytest.raises(reader.UsageError, match="choose one with snapshot_name= or snapshot_id="):
        reader.distributed_dataset(range_root, 4)
    by_name = reader.distributed_dataset(reader.open_snapshot(range_root, snapshot_name="range6"), 4, shuffle=False)
    assert sorted(v for step in by_name for v in step["id"].tolist()) == list(range(6))
    by_id = reader.distributed_dataset(reader.open_snapshot(range_root, snapshot_id="range12"), 4, shuffle=False)
    assert by_id.steps_per_epoch == 3
    assert reader.dataset(reader.open_snapshot(range_root, snapshot_name="range6"), 4).cardinality().numpy() == 2
    with pytest.raises(reader.UsageError, match="is an opened snapshot: give open_snapshot the root"):
        reader.open_snapshot(reader.open_snapshot(range_root / "range6"), snapshot_name="range6")


def test_missing_root_says_where_and_what_to_do(tmp_path):
    with pytest.raises(reader.SnapshotNotFoundError, match="materialize"):
        reader.distributed_dataset(tmp_path / "nowhere", 4)


def test_pending_and_failed_snapshots_are_named(tmp_path):
    run = commit.RunSpec(root=str(tmp_path), snapshot_id="daily", run_id=commit.new_run_id(), snapshot_name="daily")
    commit.begin_run(run)
    with pytest.raises(reader.SnapshotInProgressError, match=f"pending by run {run.run_id} since"):
        reader.open_snapshot(tmp_path)
    commit.mark_failed(run, "preprocessing_fn raised")
    with pytest.raises(reader.SnapshotInProgressError, match="failed.*preprocessing_fn raised"):
        reader.open_snapshot(tmp_path)


def test_wait_seconds_waits_for_the_final_marker(range_root, copy_of):
    snapshot = copy_of(range_root / "range6")
    final = snapshot / "metadata.final"
    aside = snapshot.parent / "final.json"
    final.rename(aside)
    threading.Timer(0.5, aside.rename, args=(final,)).start()
    opened = reader.open_snapshot(snapshot.parent, wait_seconds=10, poll_seconds=0.1)
    assert opened.num_rows == 6


def begun_run(root: pathlib.Path, **begin) -> commit.RunSpec:
    run = commit.RunSpec(root=str(root), snapshot_id="daily", run_id=commit.new_run_id(), snapshot_name="daily")
    commit.begin_run(run, **begin)
    return run


def refused_at_once(root: pathlib.Path) -> str:
    """The error ``open_snapshot`` raises with a minute to wait, checked to come without waiting."""
    started = time.monotonic()
    with pytest.raises(reader.SnapshotInProgressError) as error:
        reader.open_snapshot(root, wait_seconds=60, poll_seconds=0.05)
    assert time.monotonic() - started < 5 and not error.value.live_writer
    assert "\n" not in str(error.value) and "Wait for the writer" not in str(error.value)
    return str(error.value)


def test_wait_seconds_returns_at_once_on_a_failed_run(tmp_path):
    run = begun_run(tmp_path)
    commit.mark_failed(run, "preprocessing_fn raised KeyError")
    message = refused_at_once(tmp_path)
    assert re.search(
        rf"run {run.run_id} failed at \d{{4}}-\d\d-\d\dT[\d:]+Z on .*: preprocessing_fn raised KeyError", message
    )
    assert "rerun the materialize job" in message


def test_wait_seconds_returns_at_once_on_a_run_whose_writer_is_gone(tmp_path):
    run = begun_run(tmp_path)
    writer = subprocess.Popen(["sleep", "30"])
    ticks = writer_process.start_ticks(writer.pid)
    writer.kill()
    writer.wait()
    marker_path = tmp_path / "daily" / "snapshot.metadata"
    marker = json.loads(marker_path.read_text())
    marker["writer"].update(pid=str(writer.pid), process_start_ticks=str(ticks))
    marker_path.write_text(json.dumps(marker))
    message = refused_at_once(tmp_path)
    assert f"run {run.run_id} since" in message and "was abandoned: that process is gone" in message


def test_wait_seconds_returns_at_once_on_an_expired_run(tmp_path):
    run = begun_run(tmp_path, now=time.time() - 2 * 86400)
    message = refused_at_once(tmp_path)
    assert f"run {run.run_id} since" in message and "not finalized within the 24 h expiry" in message


def test_wait_seconds_waits_the_whole_time_for_a_live_writer(tmp_path):
    begun_run(tmp_path)
    started = time.monotonic()
    with pytest.raises(reader.SnapshotInProgressError, match="Wait for the writer") as error:
        reader.open_snapshot(tmp_path, wait_seconds=0.3, poll_seconds=0.05)
    assert time.monotonic() - started >= 0.3 and error.value.live_writer


def test_mode_read_reads_committed_shards_of_a_pending_snapshot_with_a_warning(uneven_snapshot, copy_of):
    snapshot = copy_of(uneven_snapshot)
    (snapshot / "metadata.final").unlink()
    with pytest.raises(reader.SnapshotInProgressError):
        reader.distributed_dataset(snapshot.parent, 100)
    with pytest.warns(UserWarning, match="not finalized"):
        dataset = reader.distributed_dataset(reader.open_snapshot(snapshot.parent, mode="read"), 100, seed=1)
    assert sorted(i for step in dataset for i in step["id"].tolist()) == list(range(2000))
    with pytest.raises(reader.UsageError, match="mode="):
        reader.open_snapshot(snapshot.parent, mode="write")


def test_corrupt_byte_is_found_with_verify_checksums_and_names_the_shard(uneven_snapshot, copy_of):
    snapshot = copy_of(uneven_snapshot)
    shard = first_shard(snapshot)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(reader.CorruptSnapshotError, match=shard.name):
        list(reader.distributed_dataset(snapshot, 100, read=reader.ReadOptions(verify_checksums=True)))
    with pytest.raises(reader.CorruptSnapshotError, match=f"{shard.name}.*CRC32C"):
        reader.open_snapshot(snapshot).verify()


def flip_a_data_byte(shard: pathlib.Path, block: int) -> None:
    """Flips a byte in the middle of a block's body: data, not the file's header, footer or the block's header."""
    data = bytearray(shard.read_bytes())
    span = block_io.read_layout(pa.BufferReader(bytes(data)), len(data)).blocks[block]
    data[span.body_offset + span.body_bytes // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


@pytest.mark.parametrize("columns", [None, ["id"]], ids=["decoded", "direct"])
def test_a_flipped_data_byte_is_found_by_the_first_read_with_block_checks(uneven_snapshot, copy_of, columns):
    """With read=ReadOptions(verify_checksums="blocks") each block is checked against its CRC32C when this process first reads it, on
    either way of reading (``["id"]`` alone is read straight from the uncompressed shard, the payload never decoded).
    Without checks the damaged byte is read as data."""
    snapshot = copy_of(uneven_snapshot)
    shard = first_shard(snapshot)
    flip_a_data_byte(shard, 1)
    assert (
        len([row for step in reader.distributed_dataset(snapshot, 100, columns=columns) for row in step["id"]]) == 2000
    )
    with pytest.raises(reader.CorruptSnapshotError) as error:
        list(
            reader.distributed_dataset(
                snapshot, 100, columns=columns, shuffle=False, read=reader.ReadOptions(verify_checksums="blocks")
            )
        )
    one_line = (
        rf"block 1 of shard {re.escape(str(shard))}: CRC32C [0-9a-f]{{8}} differs from the manifest's .*--mode=write"
    )
    assert re.fullmatch(one_line, str(error.value)), str(error.value)
    with pytest.raises(reader.CorruptSnapshotError, match=f"{shard.name}: block 1 CRC32C"):
        reader.open_snapshot(snapshot).verify()


def test_truncated_shard_is_named_without_verify_checksums(uneven_snapshot, copy_of):
    snapshot = copy_of(uneven_snapshot)
    shard = first_shard(snapshot)
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(reader.CorruptSnapshotError, match=f"{shard.name}.*truncated"):
        list(reader.distributed_dataset(snapshot, 100))


def test_missing_shard_is_named(uneven_snapshot, copy_of):
    snapshot = copy_of(uneven_snapshot)
    shard = first_shard(snapshot)
    shard.unlink()
    with pytest.raises(reader.CorruptSnapshotError, match=f"{shard.name}: missing"):
        list(reader.distributed_dataset(snapshot, 100))


def test_newer_format_version_is_refused(range_root, copy_of):
    snapshot = copy_of(range_root / "range4")
    final = snapshot / "metadata.final"
    manifest = json.loads(final.read_text())
    manifest["formatVersion" if "formatVersion" in manifest else "format_version"] = "2.0"
    final.write_text(json.dumps(manifest, sort_keys=True))
    with pytest.raises(reader.FormatVersionError, match="Upgrade snapfeed"):
        reader.open_snapshot(snapshot)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"global_batch_size": 0}, "at least 1"),
        ({"global_batch_size": 4, "columns": ["nope"]}, r"unknown columns \['nope'\]"),
        ({"global_batch_size": 4, "output": "mxnet"}, "numpy, tf, torch, jax"),
        ({"global_batch_size": 4, "shard_policy": "HASH"}, "AUTO, FILE, DATA, OFF"),
        ({"global_batch_size": 4, "num_epochs": 0}, "num_epochs"),
        ({"global_batch_size": 4, "read": partial(reader.ReadOptions, prefetch="lots")}, "prefetch"),
        (
            {"global_batch_size": 4, "read": partial(reader.ReadOptions, num_reader_threads="MANY")},
            "num_reader_threads='MANY'; give a positive",
        ),
        (
            {"global_batch_size": 4, "read": partial(reader.ReadOptions, num_reader_threads=0)},
            "num_reader_threads=0; give a positive",
        ),
        ({"global_batch_size": 4, "shuffle_buffer_size": -1}, "shuffle_buffer_size=-1; give a positive"),
        (
            {"global_batch_size": 4, "cache": partial(reader.CacheOptions, max_bytes="big")},
            "max_bytes='big'; give a positive",
        ),
        (
            {"global_batch_size": 4, "read": partial(reader.ReadOptions, verify_checksums="yes")},
            "choose False .*, 'blocks' .* or True",
        ),
        ({"global_batch_size": 4, "num_replicas": 2, "input_context": reader.InputContext()}, "either"),
        (
            {"global_batch_size": 4, "read": {"prefetch": 2}},
            r"read=\{'prefetch': 2\}; give a reader.ReadOptions\(...\) or None",
        ),
        ({"global_batch_size": 4, "cache": "/tmp/c"}, r"cache='/tmp/c'; give a reader.CacheOptions\(...\) or None"),
        (
            {"global_batch_size": 4, "placement": {"device": "cpu"}},
            r"placement=\{'device': 'cpu'\}; give a reader.PlacementOptions\(...\) or None",
        ),
        (
            {"global_batch_size": 4, "service": 8080},
            r"service=8080; give 'grpc://host:port' or a reader.ServiceOptions\(address=...\)",
        ),
    ],
)
def test_bad_arguments_are_usage_errors(range_root, kwargs, message):
    """A group's bad value is refused where it is made (``partial``: made inside the check)."""
    with pytest.raises(reader.UsageError, match=message):
        given = {name: value() if isinstance(value, partial) else value for name, value in kwargs.items()}
        reader.distributed_dataset(range_root / "range4", **given)


@pytest.mark.parametrize("keyword", ["output", "service", "placement", "strategy", "num_replicas", "metrics"])
def test_reader_dataset_refuses_what_only_distributed_dataset_takes(range_root, keyword):
    """reader.dataset reads locally into a tf.data.Dataset: what only distributed_dataset takes is not a keyword of it."""
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
        reader.dataset(range_root / "range4", 2, **{keyword: "x"})


def test_reader_dataset_reads_with_distributed_datasets_defaults(range_root):
    batches = [batch for batch in reader.dataset(range_root / "range4", 3, shuffle=False).as_numpy_iterator()]
    assert [len(next(iter(batch.values()))) for batch in batches] == [3, 1], "num_epochs=1, partial last batch"


@pytest.mark.parametrize("verify_checksums", [False, "blocks", True])
@pytest.mark.parametrize("golden", ["golden", "golden-1.1"])
def test_the_golden_snapshots_read_with_every_check(golden, verify_checksums):
    """Format 1.0 (no block CRC32Cs: only the whole-shard check applies) and 1.1 (block CRC32Cs, checked by
    "blocks" and by verify(), against the byte ranges the shard's footer lists)."""
    snapshot = reader.open_snapshot(GOLDEN_ROOT / golden)
    assert bool(snapshot.metadata.shards[0].block_crc32c) == (snapshot.metadata.format_version == "1.1")
    rows = [
        i
        for step in reader.distributed_dataset(snapshot, 4, read=reader.ReadOptions(verify_checksums=verify_checksums))
        for i in step["id"]
    ]
    assert sorted(rows) == list(range(20)) and snapshot.verify() == 1


def test_a_missing_bucket_is_one_line_naming_the_path_given(object_store):
    """Opening reads the snapshot's manifest first (``_finalized_at``); the store's errors still name the
    path the user gave, not the marker's."""
    scheme = object_store.scheme
    path = f"{scheme}://no-such-bucket-for-open/snap"
    with pytest.raises(StorageError) as raised:
        reader.open_snapshot(path)
    message = str(raised.value)
    assert message.startswith(f"bucket {scheme}://no-such-bucket-for-open does not exist ({path}): create it"), message
    assert "\n" not in message
