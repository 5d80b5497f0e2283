import io

import google_crc32c
import numpy as np
import pyarrow as pa
import pytest

from schemas import columns, shard_codec
from schemas.errors import CorruptSnapshotError, UsageError
from schemas.shard_codec import BlockAccumulator, Compression, ShardWriter


def batch(start: int, rows: int) -> pa.RecordBatch:
    ids = np.arange(start, start + rows)
    return columns.record_batch_from_arrays(
        {"id": ids, "image": np.broadcast_to(ids[:, None, None], (rows, 4, 3)).astype(np.uint8)}
    )


@pytest.mark.parametrize("compression", [c for c in Compression if c is not Compression.AUTO])
def test_round_trip_with_checksum_and_block_rows(compression):
    sink = io.BytesIO()
    accumulator = BlockAccumulator(block_bytes=2000)
    writer = ShardWriter(sink, batch(0, 1).schema, compression)
    for start in range(0, 500, 37):
        for block in accumulator.add(batch(start, 37)):
            writer.write_block(block)
    for block in accumulator.flush():
        writer.write_block(block)
    stats = writer.close()
    data = sink.getvalue()
    assert stats.num_bytes == len(data)
    assert stats.crc32c == google_crc32c.value(data)
    reader = shard_codec.open_shard(pa.BufferReader(data), "mem")
    assert [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)] == list(stats.block_rows)
    table = reader.read_all()
    assert table.column("id").to_pylist() == list(range(0, 518))
    images = columns.column_to_numpy(table.combine_chunks().column("image").chunk(0))
    assert images.shape == (518, 4, 3) and images[17, 3, 2] == 17


def test_blocks_are_about_the_target_size():
    accumulator = BlockAccumulator(block_bytes=10_000)
    blocks = [b for start in range(0, 5000, 100) for b in accumulator.add(batch(start, 100))]
    blocks += list(accumulator.flush())
    assert sum(b.num_rows for b in blocks) == 5000
    assert all(abs(b.nbytes - 10_000) < 200 for b in blocks[:-1])


def test_empty_batches_are_ignored():
    accumulator = BlockAccumulator(block_bytes=100)
    assert list(accumulator.add(batch(0, 0))) == [] and list(accumulator.flush()) == []


@pytest.mark.parametrize("name", ["GZIP", "snappy"])
def test_rfc_codecs_are_refused_naming_the_alternatives(name):
    with pytest.raises(UsageError, match="ZSTD.*LZ4"):
        Compression.parse(name)


def test_auto_compresses_a_shard_only_where_lz4_pays():
    assert Compression.parse("AUTO") is Compression.AUTO
    random_bytes = np.random.default_rng(0).integers(0, 256, (64, 32, 32, 3), dtype=np.uint8)
    images = columns.record_batch_from_arrays({"image": random_bytes, "label": np.arange(64)})
    assert Compression.AUTO.for_shard(images) is Compression.NONE
    assert Compression.AUTO.for_shard(batch(0, 500)) is Compression.LZ4
    assert Compression.ZSTD.for_shard(images) is Compression.ZSTD


def test_auto_must_be_resolved_before_writing():
    with pytest.raises(ValueError, match="for_shard"):
        ShardWriter(io.BytesIO(), batch(0, 1).schema, Compression.AUTO)


def test_truncated_shard_is_named():
    sink = io.BytesIO()
    writer = ShardWriter(sink, batch(0, 1).schema, Compression.LZ4)
    writer.write_block(batch(0, 10))
    writer.close()
    with pytest.raises(CorruptSnapshotError, match="shard /x/shard-1.arrow is unreadable"):
        shard_codec.open_shard(pa.BufferReader(sink.getvalue()[:-20]), "/x/shard-1.arrow")


@pytest.mark.parametrize("second_bytes", [0, 1, 1000, (1 << 20) - 1, 1 << 20, (3 << 20) + 5])
def test_crc32c_of_parts_combine_into_the_whole_files(second_bytes):
    rng = np.random.default_rng(second_bytes)
    first, second = rng.bytes(777), rng.bytes(second_bytes)
    combined = shard_codec.crc32c_concat(google_crc32c.value(first), google_crc32c.value(second), len(second))
    assert combined == google_crc32c.value(first + second)
    assert shard_codec.crc32c_concat(0, google_crc32c.value(second), len(second)) == google_crc32c.value(second)
    assert shard_codec.crc32c_concat(google_crc32c.value(first), 0, 0) == google_crc32c.value(first)
