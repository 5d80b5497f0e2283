"""Block I/O: footers and headers parsed as Arrow wrote them, coalesced reads, fetched reads equal to direct ones."""

import concurrent.futures
import io
import os
import pathlib
import subprocess
import sys
import threading
import weakref

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import reader
from reader.core import block_io, blocks, direct_shard, ipc_layout
from reader.core.blocks import BlockReader
from reader.core.direct_shard import BlockExtents, ColumnExtent, DirectShard, LocalShardFile
from reader.core.loading import Loading
from schemas import columns, storage
from tests import helpers

# --- coalescing -------------------------------------------------------------------------------------------


def test_adjacent_and_near_ranges_merge_in_file_order():
    ranges = [(300, 400), (0, 100), (100, 200), (205, 290)]
    assert block_io.coalesce(ranges, max_bytes=1000, max_gap=10) == [(0, 400)]
    assert block_io.coalesce(ranges, max_bytes=1000, max_gap=0) == [(0, 200), (205, 290), (300, 400)]


def test_merged_ranges_stay_within_the_limit_and_a_longer_range_stays_whole():
    ranges = [(i * 100, (i + 1) * 100) for i in range(10)]
    assert block_io.coalesce(ranges, max_bytes=300, max_gap=0) == [(0, 300), (300, 600), (600, 900), (900, 1000)]
    assert block_io.coalesce([(0, 500), (500, 600)], max_bytes=300, max_gap=0) == [(0, 500), (500, 600)]
    assert block_io.coalesce([], max_bytes=300, max_gap=0) == []


def test_a_gap_wider_than_allowed_splits():
    assert block_io.coalesce([(0, 10), (30, 40)], max_bytes=100, max_gap=19) == [(0, 10), (30, 40)]
    assert block_io.coalesce([(0, 10), (30, 40)], max_bytes=100, max_gap=20) == [(0, 40)]


# --- footers and headers, against files pyarrow wrote -------------------------------------------------------


def mixed_table(rows: int) -> pa.Table:
    """Strings, lists, structs, maps and bools before and between fixed-width columns, with some nulls."""
    ids = np.arange(rows, dtype=np.int64)
    return pa.table(
        {
            "name": pa.array([None if i % 7 == 0 else f"row{i}" for i in range(rows)]),
            "id": ids,
            "tags": pa.array([[i, i + 1][: i % 3] for i in range(rows)], pa.large_list(pa.int64())),
            "flag": pa.array([i % 2 == 0 for i in range(rows)]),
            "where": pa.array([{"x": i, "y": str(i)} for i in range(rows)]),
            "attrs": pa.array([[("k", i)] for i in range(rows)], pa.map_(pa.string(), pa.int64())),
            "image": columns.record_batch_from_arrays(
                {"image": (ids[:, None, None] % 251 + np.zeros((1, 4, 3))).astype(np.uint8)}
            ).column(0),
            "value": (ids * 0.5).astype(np.float32),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(rows * 3, dtype=np.float64)), 3),
        }
    )


def ipc_file(table: pa.Table, compression: str | None, rows_per_block: int) -> bytes:
    sink = io.BytesIO()
    with ipc.new_file(sink, table.schema, options=ipc.IpcWriteOptions(compression=compression)) as writer:
        for batch in table.to_batches(max_chunksize=rows_per_block):
            writer.write_batch(batch)
    return sink.getvalue()


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_footer_blocks_are_the_record_batches_pyarrow_reads(compression):
    table = mixed_table(1000)
    data = ipc_file(table, compression, 90)
    layout = block_io.read_layout(pa.BufferReader(data), len(data))
    theirs = ipc.open_file(pa.py_buffer(data))
    assert len(layout.blocks) == theirs.num_record_batches == 12 and layout.dictionaries == 0
    for index, block in enumerate(layout.blocks):
        message = pa.py_buffer(data)[block.offset : block.end]
        assert block_io.decode_block(message, table.schema).equals(theirs.get_batch(index))
        header = ipc_layout.parse_batch_header(data[block.offset : block.body_offset])
        assert header.rows == theirs.get_batch(index).num_rows
        assert header.compressed == (compression is not None)
        assert header.body_bytes == block.body_bytes
        assert (len(header.nodes), len(header.buffers)) == ipc_layout.slot_totals(ipc_layout.column_slots(table.schema))


def test_a_footer_longer_than_the_tail_read_is_read_whole():
    table = pa.table({"id": np.arange(4000, dtype=np.int64)})
    data = ipc_file(table, None, 1)  # 4000 blocks: a footer of about 96 KB
    assert ipc_layout.footer_length(data[-ipc_layout.TRAILER_BYTES :]) > block_io.TAIL_BYTES
    layout = block_io.read_layout(pa.BufferReader(data), len(data))
    assert len(layout.blocks) == 4000
    last = layout.blocks[-1]
    assert block_io.decode_block(pa.py_buffer(data)[last.offset : last.end], table.schema).column(0).to_pylist() == [
        3999
    ]


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (lambda data: data[:-3], "ARROW1"),
        (lambda data: b"x" * 100, "ARROW1"),
        (lambda data: data[:-10] + (10**9).to_bytes(4, "little") + data[-6:], "footer length"),
        (lambda data: b"ARROW1", "too few"),
    ],
    ids=["cut", "not-arrow", "footer-too-long", "tiny"],
)
def test_what_is_not_a_whole_ipc_file_is_a_value_error_saying_why(damage, words):
    data = damage(ipc_file(pa.table({"id": np.arange(10)}), None, 5))
    with pytest.raises(ValueError, match=words):
        block_io.read_layout(pa.BufferReader(data), len(data))


def test_a_short_read_says_where_the_file_ends():
    with pytest.raises(block_io.ShortReadError, match="ends at byte 10") as error:
        block_io.read_exactly(pa.BufferReader(b"x" * 10), 4, 20)
    assert error.value.end == 10


@pytest.fixture(scope="module")
def snapshots(tmp_path_factory):
    """The same rows (strings before fixed-width columns) stored uncompressed and with LZ4, in small blocks."""
    root = tmp_path_factory.mktemp("block_io")
    rows = 3000
    ids = np.arange(rows, dtype=np.int64)
    image = ((ids[:, None] * 7 + np.arange(300)[None, :]) % 251).astype(np.uint8).reshape(rows, 10, 10, 3)
    batches = [
        {
            "name": np.array([f"row{i}" for i in ids[s : s + 500]], dtype=object),
            "id": ids[s : s + 500],
            "image": image[s : s + 500],
            "value": (ids[s : s + 500] * 0.5).astype(np.float32),
        }
        for s in range(0, rows, 500)
    ]
    options = {"block_size_bytes": 20_000, "shard_size_bytes": 230_000}  # 11 blocks a shard, 5 in the last
    return {
        "none": helpers.write_snapshot(root, "none", batches, compression="NONE", **options),
        "lz4": helpers.write_snapshot(root, "lz4", batches, compression="LZ4", **options),
        "rows": rows,
    }


def shard_extents(mapped: pa.MemoryMappedFile, dtypes: dict[str, np.dtype]) -> list[BlockExtents] | None:
    """The oracle: every block's column extents as Arrow's own reader finds them over a memory map (its
    buffers are zero-copy there, so an address minus the map's base is a file offset)."""
    span = (mapped.read_buffer(1).address, mapped.size())
    mapped.seek(0)
    ipc_file = ipc.open_file(mapped)
    blocks = []
    for index in range(ipc_file.num_record_batches):
        batch = ipc_file.get_batch(index)
        columns = {name: _column_extent(batch.column(name), dtype, span) for name, dtype in dtypes.items()}
        if None in columns.values():
            return None
        blocks.append(BlockExtents(batch.num_rows, columns))
    return blocks


def _column_extent(column: pa.Array, dtype: np.dtype, span: tuple[int, int]) -> ColumnExtent | None:
    storage = column.storage if isinstance(column, pa.ExtensionArray) else column
    width = 1
    if pa.types.is_fixed_size_list(storage.type):
        if storage.null_count or storage.offset:
            return None
        width, storage = storage.type.list_size, storage.values
    value_type = storage.type
    if storage.null_count or not (pa.types.is_integer(value_type) or pa.types.is_floating(value_type)):
        return None
    if np.dtype(value_type.to_pandas_dtype()) != dtype:
        return None
    start = storage.buffers()[1].address + storage.offset * dtype.itemsize
    row_bytes = width * dtype.itemsize
    base, size = span
    if start < base or start + len(column) * row_bytes > base + size:
        return None  # decoded into memory of its own: the block is compressed
    return ColumnExtent(start - base, row_bytes)


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_the_manifest_records_each_blocks_crc32c_over_the_byte_range_its_footer_lists(snapshots, codec):
    """What the writer checksums as the bytes pass (format 1.1) is what the reader reads for a block."""
    snapshot = reader.open_snapshot(snapshots[codec])
    for shard in snapshot.metadata.shards:
        data = pathlib.Path(snapshot.paths.absolute(shard.path)).read_bytes()
        spans = block_io.read_layout(pa.BufferReader(data), len(data)).blocks
        assert list(shard.block_crc32c) == [google_crc32c.value(data[s.offset : s.end]) for s in spans]
        assert len(spans) == len(shard.block_rows) > 1


def test_column_extents_from_block_headers_are_those_arrow_finds_over_a_memory_map(snapshots):
    snapshot = reader.open_snapshot(snapshots["none"])
    names = ["image", "id", "value"]
    source = BlockReader(snapshot, names, verify_checksums=False)
    dtypes = {name: np.dtype(snapshot.element_spec[name].dtype) for name in names}
    assert snapshot.num_shards > 2
    for shard in range(snapshot.num_shards):
        with pa.memory_map(snapshot.shard_path(shard)) as mapped:
            expected = shard_extents(mapped, dtypes)
        direct = source._direct_shard(shard)
        assert direct is not None and len(direct.blocks) == len(expected) > 1
        assert [direct.blocks[i] for i in range(len(expected))] == expected


def test_no_column_of_a_compressed_block_is_taken_for_a_run_of_bytes(snapshots):
    snapshot = reader.open_snapshot(snapshots["lz4"])
    source = BlockReader(snapshot, ["id"], verify_checksums=False, direct_reads=True)
    assert source._direct_shard(0) is None, "the manifest says LZ4"
    opened = source._files.open(0)
    assert source._extents(0, opened, 0) is None, "the header says compressed"


# --- fetches ------------------------------------------------------------------------------------------------


class CountingFile:
    """A file whose reads are counted (as an object store would count GETs)."""

    def __init__(self, data: bytes) -> None:
        self._file = pa.BufferReader(data)
        self.reads: list[tuple[int, int]] = []

    def size(self) -> int:
        return self._file.size()

    def get_stream(self, offset: int, nbytes: int):
        self.reads.append((offset, nbytes))
        return self._file.get_stream(offset, nbytes)


def test_a_fetch_reads_adjacent_blocks_once_and_lets_go_of_them_as_they_are_taken():
    table = pa.table({"id": np.arange(1000, dtype=np.int64)})
    data = ipc_file(table, None, 100)
    layout = block_io.read_layout(pa.BufferReader(data), len(data))
    file = CountingFile(data)
    wanted = [0, 1, 2, 5, 6, 2]  # 2 twice; 3 and 4 not at all
    blocks = [((0, index), layout.blocks[index]) for index in wanted]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        fetch = block_io.Fetch(blocks, lambda shard: file, pool, max_bytes=1 << 20, max_gap=0)
        assert fetch.requests == 2 and len(file.reads) <= 2
        assert fetch.bytes == sum(layout.blocks[i].length for i in set(wanted))
        assert (0, 3) not in fetch and (0, 5) in fetch
        for index in wanted:
            batch = block_io.decode_block(fetch.take((0, index)), table.schema)
            assert batch.column(0).to_pylist() == list(range(index * 100, index * 100 + 100))
        assert fetch.held_bytes == 0
    assert sorted(file.reads) == [
        (layout.blocks[0].offset, layout.blocks[2].end - layout.blocks[0].offset),
        (layout.blocks[5].offset, layout.blocks[6].end - layout.blocks[5].offset),
    ]


def test_ranges_in_the_page_cache_are_read_by_their_first_taker_not_the_pool():
    table = pa.table({"id": np.arange(1000, dtype=np.int64)})
    data = ipc_file(table, None, 100)
    layout = block_io.read_layout(pa.BufferReader(data), len(data))
    file = CountingFile(data)

    class NoPool:
        def submit(self, *args):
            raise AssertionError("a cached range went to the I/O pool")

    blocks = [((0, index), layout.blocks[index]) for index in (0, 1, 5)]
    fetch = block_io.Fetch(blocks, lambda shard: file, NoPool(), max_gap=0, cached=lambda shard, offset: True)
    assert fetch.requests == 2 and not file.reads, "nothing read before it is taken"
    for index in (5, 0, 1):
        batch = block_io.decode_block(fetch.take((0, index)), table.schema)
        assert batch.column(0).to_pylist()[0] == index * 100
    assert len(file.reads) == 2 and fetch.held_bytes == 0
    cancelled = block_io.Fetch(blocks[:1], lambda shard: file, NoPool(), cached=lambda shard, offset: True)
    cancelled.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        cancelled.take((0, 0))


def test_a_merged_reads_buffer_is_reused_once_every_use_of_it_was_copied_out():
    table = pa.table({"id": np.arange(1000, dtype=np.int64)})
    data = ipc_file(table, None, 100)
    layout = block_io.read_layout(pa.BufferReader(data), len(data))
    buffers = block_io.FetchBuffers(keep_bytes=1 << 20)

    def fetch(indices):
        blocks = [((0, index), layout.blocks[index]) for index in indices]
        return block_io.Fetch(blocks, lambda shard: pa.BufferReader(data), pool, max_gap=0, buffers=buffers)

    def ids(message) -> list[int]:
        return block_io.decode_block(message, table.schema).column(0).to_pylist()

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = fetch([2, 2])  # one block, two uses
        used = first.take((0, 2), copied_after=True)
        assert ids(used)[0] == 200
        first.copied((0, 2))
        assert buffers.kept_bytes == 0, "reused while a use has not copied its bytes out yet"
        again = first.take((0, 2), copied_after=True)
        address = again.address
        del used, again
        first.copied((0, 2))
        assert buffers.kept_bytes == buffers.capacity(layout.blocks[2].length)

        second = fetch([7])  # a block of the same size class: read into the kept buffer, and correctly
        message = second.take((0, 7))
        assert message.address == address and ids(message) == list(range(700, 800))
        assert buffers.kept_bytes == 0
        second.copied((0, 7))
        assert buffers.kept_bytes == 0, "a use that did not promise to copy its bytes out may keep them"


@pytest.mark.parametrize("size", [1, 4096, 10_000, 1_000_000, (1 << 20) - 1, 1 << 20, 16 << 20, (16 << 20) + 1])
def test_a_size_class_is_at_most_an_eighth_or_under_a_page_larger(size):
    capacity = block_io.FetchBuffers.capacity(size)
    assert size <= capacity <= max(size * 9 // 8, size + 4095) and capacity % 4096 == 0
    assert block_io.FetchBuffers.capacity(capacity) == capacity


def test_blocks_about_equally_long_share_a_size_class():
    assert {block_io.FetchBuffers.capacity(size) for size in range(1_000_000, 1 << 20, 997)} == {1 << 20}


def test_fetch_buffers_keep_no_more_than_asked():
    buffers = block_io.FetchBuffers(keep_bytes=3 << 20)
    taken = [buffers.take(1_000_000), buffers.take((2 << 20) - 5)]
    assert [b.size for b in taken] == [1 << 20, 2 << 20]
    for buffer in taken:
        buffers.give_back(buffer)
    assert buffers.kept_bytes == 3 << 20
    buffers.give_back(pa.allocate_buffer(1 << 20))
    assert buffers.kept_bytes == 3 << 20, "past keep_bytes: let go"
    assert buffers.take((2 << 20) - 100).address == taken[1].address
    assert buffers.kept_bytes == 1 << 20
    assert block_io.FetchBuffers(0).take(100).size == 100, "none kept: no rounding up either"


def test_a_failed_read_reaches_the_block_that_needed_it():
    class Broken:
        def get_stream(self, offset, nbytes):
            raise OSError("connection reset")

    block = ipc_layout.BlockRange(8, 100, 100)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        fetch = block_io.Fetch([((0, 0), block)], lambda shard: Broken(), pool)
        with pytest.raises(OSError, match="connection reset"):
            fetch.take((0, 0))


# --- the reader, through the fetched path ---------------------------------------------------------------------


def steps(path, **options) -> list[dict[str, np.ndarray]]:
    return list(reader.distributed_dataset(path, 64, **options))


@pytest.mark.parametrize(
    "options",
    [{"seed": 3, "num_epochs": 2}, {"shuffle": False}, {"seed": 3, "columns": ["image", "id"]}],
    ids=["shuffled", "in-order", "projected"],
)
def test_fetched_reads_give_exactly_the_steps_of_direct_reads(snapshots, monkeypatch, options):
    snapshot = reader.open_snapshot(snapshots["none"])
    options = {"columns": ["id", "image", "value"], **options}
    direct = steps(snapshot, **options)
    original = BlockReader.read

    def fetched_only(self, piece, fetch=None, **copied_after):
        assert fetch is not None, "every block of a window comes from its fetch"
        return original(self, piece, fetch, **copied_after)

    monkeypatch.setenv("SNAPFEED_DIRECT_READS", "0")
    monkeypatch.setattr(BlockReader, "read", fetched_only)
    fetched = steps(snapshot, **options)
    assert len(fetched) == len(direct) > 1
    for ours, theirs in zip(fetched, direct, strict=True):
        assert ours.keys() == theirs.keys()
        for name, values in theirs.items():
            np.testing.assert_array_equal(ours[name], values)
    ids = np.concatenate([step["id"] for step in fetched])
    assert sorted(ids.tolist()) == sorted(list(range(snapshots["rows"])) * options.get("num_epochs", 1))


@pytest.mark.parametrize("name", ["none", "lz4"])
@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "in-order"])
def test_reused_fetch_buffers_never_change_a_step(snapshots, monkeypatch, name, shuffle):
    """Many small windows read ahead a few blocks at a time, so buffers go back and are read into again
    while later windows are copied out: every step, all kept until the end, equals the direct read's.
    In order, steps are views of the fetched blocks: those buffers are never reused."""
    options = {"columns": ["id", "image", "value"], "num_epochs": 3, "shuffle": shuffle, "seed": 5}
    # 20 windows an epoch; 3 blocks kept
    options |= {"shuffle_buffer_size": 150, "read": reader.ReadOptions(read_ahead_bytes=240_000)}
    expected = steps(reader.open_snapshot(snapshots["none"]), **options)
    given_back = []
    original = block_io.FetchBuffers.give_back
    monkeypatch.setattr(block_io.FetchBuffers, "give_back", lambda self, b: given_back.append(original(self, b)))
    monkeypatch.setenv("SNAPFEED_DIRECT_READS", "0")
    fetched = steps(reader.open_snapshot(snapshots[name]), **options)
    assert len(given_back) > 100 if shuffle else not given_back
    assert len(fetched) == len(expected)
    for ours, theirs in zip(fetched, expected, strict=True):
        for column, values in theirs.items():
            np.testing.assert_array_equal(ours[column], values)


def test_a_window_of_variable_lists_keeps_its_fetched_buffers(tmp_path):
    """Variable-length lists are views of the block's bytes in the window, not copies: their buffers are
    never reused, so every step, all kept until the end, holds its rows' own tokens."""
    ids = np.arange(2000, dtype=np.int64)
    tokens = np.empty(len(ids), dtype=object)
    tokens[:] = [np.arange(i % 7 + 1, dtype=np.int64) + 10 * i for i in ids]
    path = helpers.write_snapshot(
        tmp_path, "tokens", [{"id": ids, "tokens": tokens}], compression="NONE", block_size_bytes=8_000
    )
    options = {
        "seed": 2,
        "num_epochs": 3,
        "shuffle_buffer_size": 120,
        "read": reader.ReadOptions(read_ahead_bytes=200_000),
    }
    kept = steps(path, **options)
    assert len(kept) > 60
    for step in kept:
        for row, values in zip(step["id"], step["tokens"], strict=True):
            np.testing.assert_array_equal(values, np.arange(row % 7 + 1) + 10 * row)


@pytest.mark.parametrize("name", ["none", "lz4"])
def test_object_store_reads_are_one_request_per_block_or_fewer_and_coalesce_in_order(snapshots, monkeypatch, name):
    """Shards that are not local are fetched: whole blocks, neighbours merged, never a read per column."""
    snapshot = reader.open_snapshot(snapshots[name])
    files: list[CountingFile] = []

    def counted(path):
        file = CountingFile(pathlib.Path(path).read_bytes())
        files.append(file)
        return file

    monkeypatch.setattr(storage, "local_path", lambda path: None)
    monkeypatch.setattr(storage, "open_random_access", counted)
    blocks = sum(len(rows) for rows in snapshot.block_rows)
    for options, most in [({"seed": 1}, blocks), ({"shuffle": False}, snapshot.num_shards * 2)]:
        files.clear()
        ids = np.concatenate([step["id"] for step in steps(snapshot, **options)])
        assert sorted(ids.tolist()) == list(range(snapshots["rows"]))
        block_reads = sum(len(file.reads) for file in files) - snapshot.num_shards  # a footer read per shard
        assert 0 < block_reads <= most, options


def test_a_snapshot_on_an_object_store_reads_as_it_does_on_disk(snapshots, object_store):
    """Through the emulator (moto's S3, fake-gcs-server): every block fetched by ranged GETs, and the
    steps equal the local snapshot's, shuffled and in order."""
    local = snapshots["lz4"]
    remote = reader.open_snapshot(object_store.copy_in(local, "lz4"))
    for options in ({"seed": 7, "shuffle_buffer_size": 400}, {"shuffle": False}):
        expected = steps(reader.open_snapshot(local), **options)
        got = steps(remote, **options)
        assert len(got) == len(expected) > 1
        for ours, theirs in zip(got, expected, strict=True):
            for name, values in theirs.items():
                np.testing.assert_array_equal(ours[name], values)


@pytest.mark.parametrize("object_store", ["gs"], indirect=True)
def test_a_reader_of_a_gcs_snapshot_opens_it_without_google_cloud_storage(snapshots, object_store):
    """Importing google-cloud-storage and making its client was 0.18-0.2 s of a gs:// snapshot's first
    batch: pyarrow, which streams the shards, answers the bucket check, the folder and marker lookups and
    the metadata reads (``schemas.stores.gcs``). A new process reads every row without importing it."""
    remote = object_store.copy_in(snapshots["none"], "none")
    program = (
        "import sys, reader\n"
        f"rows = sum(len(step['id']) for step in reader.distributed_dataset({remote!r}, 64, seed=1, num_epochs=1))\n"
        "print(rows, 'google.cloud.storage' in sys.modules)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", program], env=helpers.cli_env(), capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.split() == [str(snapshots["rows"]), "False"]


def test_a_snapshot_folder_on_a_bucket_opens_from_its_manifest_without_a_listing(snapshots, proxied):
    """A snapshot's own folder is known by its manifest: no listing and no HEAD first (two round trips
    of a bucket snapshot's first batch, ``reader.core.snapshot._finalized_at``). The proxy withholds the
    response to any listing once; the listing would be retried, so only the count shows that none was made."""
    copy_in, proxy = proxied
    remote = copy_in(snapshots["none"], "none")
    proxy.drop_response(lambda method, target, headers: method == "GET" and "prefix=" in target, times=1)
    snapshot = reader.open_snapshot(remote)
    assert snapshot.num_rows == snapshots["rows"]
    assert proxy.stats()["responses_dropped"] == 0
    root = reader.open_snapshot(remote.rsplit("/", 1)[0])  # a folder of snapshots is still listed
    assert root.num_rows == snapshots["rows"]
    assert proxy.stats()["responses_dropped"] == 1


def test_reads_ahead_hold_no_more_than_read_ahead_bytes_beyond_the_windows_being_loaded(snapshots, monkeypatch):
    snapshot = reader.open_snapshot(snapshots["lz4"])
    live: weakref.WeakSet = weakref.WeakSet()
    held, sizes, alive = [], [], []
    original = BlockReader.fetch

    def tracked(self, pieces, pool, **kwargs):
        fetch = original(self, pieces, pool, **kwargs)
        live.add(fetch)
        sizes.append(fetch.bytes)
        held.append(sum(f.held_bytes for f in live))
        alive.append(sum(1 for f in live if f.held_bytes))
        return fetch

    monkeypatch.setattr(BlockReader, "fetch", tracked)
    window_rows = 300
    budget = 3 * snapshot.metadata.num_bytes * window_rows // snapshot.num_rows  # about three windows
    dataset = reader.distributed_dataset(
        snapshot,
        64,
        seed=2,
        shuffle_buffer_size=window_rows,
        read=reader.ReadOptions(read_ahead_bytes=budget, reader_buffer_size=1),
    )
    ids = np.concatenate([step["id"] for step in dataset])
    assert sorted(ids.tolist()) == list(range(snapshots["rows"]))
    assert len(sizes) > 6 and max(alive) >= 3, "windows beyond the two being loaded were read ahead"
    assert max(held) <= budget + 2 * max(sizes)


@pytest.mark.parametrize(
    ("option", "value"), [("num_io_threads", 0), ("read_ahead_bytes", "lots"), ("num_io_threads", True)]
)
def test_io_options_are_positive_integers_or_auto(range_root, option, value):
    with pytest.raises(reader.UsageError, match=f"{option}="):
        reader.distributed_dataset(range_root / "range4", 2, read=reader.ReadOptions(**{option: value}))
    dataset = reader.distributed_dataset(
        range_root / "range4", 2, read=reader.ReadOptions(num_io_threads="AUTO", read_ahead_bytes=1)
    )
    assert sorted(i for step in dataset for i in step["id"].tolist()) == [0, 1, 2, 3]


# --- cold page cache (slow) ---------------------------------------------------------------------------------


def drop_page_cache() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as control:
        control.write("3\n")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/proc/sys/vm/drop_caches"), reason="needs root on Linux")
@pytest.mark.parametrize("direct", ["1", "0"], ids=["direct", "fetched"])
def test_every_row_is_read_once_on_a_cold_page_cache(tmp_path_factory, monkeypatch, direct):
    """200,000 rows of 3 KB (630 MB in 3 shards of 1 MiB blocks), read one epoch right after the page
    cache was dropped: direct reads on the I/O pool, or every block fetched by coalesced reads."""
    from testing.snapshots import write_random_rows

    root = tmp_path_factory.getbasetemp() / "cold"
    path = root / "bench-3KB"
    if not (path / "metadata.final").exists():
        write_random_rows(root, "3KB", 200_000)
    monkeypatch.setenv("SNAPFEED_DIRECT_READS", direct)
    drop_page_cache()
    seen = np.zeros(200_000, dtype=np.int64)
    for step in reader.distributed_dataset(str(path), 1024, seed=0):
        np.add.at(seen, step["label"], 1)
        assert step["image"].shape[1:] == (32, 32, 3)
    assert (seen == 1).all()


# --- direct reads: what the page cache holds is copied at once, the rest waits on the I/O pool --------------


def test_a_cached_read_copies_what_the_page_cache_holds_and_returns_the_rest(tmp_path):
    path = tmp_path / "data"
    path.write_bytes(bytes(range(256)) * 16)
    with open(path, "rb") as handle:
        handle.read()  # cached now
    direct = DirectShard(str(path), LocalShardFile(str(path)), [])
    destination = memoryview(bytearray(100))
    rest, offset = direct.read_now(destination, 10)
    assert not rest and offset == 110 and bytes(destination) == (bytes(range(256)) * 16)[10:110]
    rest, offset = direct.read_now(memoryview(bytearray(100)), 4096 - 40)
    assert len(rest) == 60 and offset == 4096, "the end of the file is left to the blocking read to name"


@pytest.mark.parametrize("cold", ["nothing cached", "no RWF_NOWAIT"])
def test_direct_reads_handed_to_the_io_pool_give_the_same_steps(snapshots, monkeypatch, cold):
    snapshot = reader.open_snapshot(snapshots["none"])
    options = {"seed": 5, "num_epochs": 2, "columns": ["id", "image", "value"], "shuffle_buffer_size": 700}
    expected = steps(snapshot, **options)
    handed_over = []
    original = blocks._read_rest

    def counted(direct, rest):
        handed_over.append(len(rest))
        original(direct, rest)

    monkeypatch.setattr(blocks, "_read_rest", counted)
    if cold == "nothing cached":
        monkeypatch.setattr(LocalShardFile, "pread_now", lambda self, destination, offset: 0)
    else:
        monkeypatch.setattr(direct_shard, "_nowait_refused", False)
        preadv = os.preadv

        def refusing(fd, buffers, offset, flags=0):
            if flags:
                raise OSError(95, "Operation not supported")
            return preadv(fd, buffers, offset)

        monkeypatch.setattr(os, "preadv", refusing)
    got = steps(snapshot, **options)
    assert len(got) == len(expected) > 1 and handed_over
    for ours, theirs in zip(got, expected, strict=True):
        for name, values in theirs.items():
            np.testing.assert_array_equal(ours[name], values)


def test_a_loading_waits_for_work_a_read_handed_to_another_pool():
    started, release = threading.Event(), threading.Event()
    done = []

    def slow():
        started.set()
        release.wait(5)
        done.append("rest")

    with (
        concurrent.futures.ThreadPoolExecutor(1) as pool,
        concurrent.futures.ThreadPoolExecutor(1) as io_pool,
    ):
        loading = Loading(pool, [lambda: io_pool.submit(slow), lambda: None], lambda results: list(done))
        threading.Timer(0.2, release.set).start()
        assert loading.result() == ["rest"]
        started.clear()
        release.clear()
        cancelled = Loading(pool, [lambda: io_pool.submit(slow)], lambda results: results)
        assert started.wait(5)
        threading.Timer(0.2, release.set).start()
        cancelled.cancel()
        assert done == ["rest", "rest"], "cancel returned only after the handed-over read finished"


def test_a_process_forked_after_reading_a_bucket_snapshot_reads_it_too(snapshots, object_store):
    """A DataLoader worker forked after the trainer read an object-store snapshot reads it in the child:
    the shards its parent opened were opened with the parent's clients."""
    remote = object_store.copy_in(snapshots["none"], "none")
    dataset = reader.distributed_dataset(remote, 256, seed=5, num_epochs=1)
    parent = np.concatenate([step["id"] for step in dataset])
    status, _, got = helpers.epoch_in_forked_child(dataset)
    assert status == 0
    assert sorted(got) == sorted(parent.tolist()) == list(range(snapshots["rows"]))
