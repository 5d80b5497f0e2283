"""What a worker streams: a split's rows in delivery order, cut where the consumer cuts, read directly or decoded."""

import os

import numpy as np
import pytest

import reader
from reader.core.blocks import BlockReader
from reader.core.plan import all_blocks
from reader.service import DispatchServer, WorkerConfig, WorkerServer, splits
from reader.service.worker_streams import in_delivery_order
from schemas.errors import SnapfeedError
from tests import helpers
from tests.reader.service.probes import ids_of, wait_for_workers


@pytest.fixture(scope="module", params=["NONE", "ZSTD"])
def small_blocks(request, tmp_path_factory):
    """600 rows in blocks of about 13 rows (a batch spans many): uncompressed (read directly) or ZSTD (decoded)."""
    root = tmp_path_factory.mktemp(f"small-blocks-{request.param}")
    batches = helpers.id_batches([10, 20, 13, 17, 11, 19] * 10)
    path = helpers.write_snapshot(
        root, "small", batches, compression=request.param, block_size_bytes=800, shard_size_bytes=4_000
    )
    return reader.open_snapshot(path)


def _expected(source: BlockReader, parts) -> dict[str, np.ndarray]:
    decoded = [source.read(part.piece) for part in parts]
    return {
        name: np.concatenate([block[name][part.order] for block, part in zip(decoded, parts, strict=True)])
        for name in decoded[0]
    }


@pytest.mark.parametrize(("batch_rows", "head", "offset"), [(64, 0, 0), (64, 5, 0), (7, 3, 25), (1000, 0, 0)])
def test_a_split_streams_its_rows_in_delivery_order_cut_where_the_consumer_cuts(small_blocks, batch_rows, head, offset):
    names = ["id", "image", "value"]
    source = BlockReader(small_blocks, names, verify_checksums=False)
    blocks = splits.job_blocks(all_blocks(small_blocks.block_rows), seed=4, iteration=1)
    parts = list(splits.remaining_parts(blocks, 4, 1, 0, offset))
    schema = small_blocks.schema
    read = []
    sent = list(
        in_delivery_order(source, small_blocks.element_spec, iter(parts), schema, batch_rows, head, read.append)
    )

    rows = sum(len(part.order) for part in parts)
    first = head or batch_rows
    sizes = [first, *[batch_rows] * ((rows - first) // batch_rows)] if rows >= first else []
    sizes += [rows - sum(sizes)] if rows - sum(sizes) else []
    assert [batch.num_rows for batch in sent] == sizes
    expected = _expected(source, parts)
    got = {
        name: np.concatenate([batch.column(name).to_numpy(zero_copy_only=False) for batch in sent]) for name in names
    }
    assert got["id"].tolist() == expected["id"].tolist(), "each row once, in the split's seeded order"
    assert np.array_equal(np.stack(got["image"]).reshape(expected["image"].shape), expected["image"])
    assert np.array_equal(got["value"], expected["value"])
    assert got["id"].tolist() != sorted(got["id"].tolist())
    direct = small_blocks.metadata.compression.upper() == "NONE"
    row_bytes = 8 + 4 * 4 * 3 + 4  # id, image, value
    whole_blocks = source.ahead_bytes([part.piece for part in parts])
    pieces_bytes = sum(part.piece.rows for part in parts) * row_bytes  # a resumed split still reads whole pieces
    assert sum(read) == (pieces_bytes if direct else whole_blocks), "direct: the pieces' bytes; else whole blocks"


@pytest.fixture
def one_worker():
    """A dispatcher and one registered worker: the dispatcher's target."""
    dispatcher = DispatchServer().start()
    worker = WorkerServer(WorkerConfig(dispatcher_address=dispatcher.target)).start()
    try:
        wait_for_workers(dispatcher.target, 1)
        yield dispatcher.target
    finally:
        worker.stop()
        dispatcher.stop()


def _damaged(tmp_path, name: str, compression: str, block_size_bytes: int, damage) -> str:
    """A snapshot of 600 (or 6000 with ZSTD) ids whose first shard ``damage(handle, size)`` changed in place."""
    rows = 2000 if compression == "ZSTD" else 200
    path = helpers.write_snapshot(
        tmp_path, name, helpers.id_batches([rows] * 3), compression=compression, block_size_bytes=block_size_bytes
    )
    shard = reader.open_snapshot(path).shard_path(0)
    with open(shard, "r+b") as handle:
        damage(handle, os.path.getsize(shard))
    return path


def _overwrite_middle(data: bytes):
    def damage(handle, size: int) -> None:
        handle.seek(size // 2)
        handle.write(data)

    return damage


def test_a_truncated_shard_read_directly_through_the_service_is_an_error_naming_verify(tmp_path, one_worker):
    path = _damaged(tmp_path, "cut", "NONE", 2_000, lambda handle, size: handle.truncate(size // 2))
    with pytest.raises(SnapfeedError, match="snapfeed verify"):
        list(reader.distributed_dataset(path, 50, service=one_worker))


def test_corrupt_bytes_are_caught_by_the_workers_when_the_consumer_asks_verify_checksums(tmp_path, one_worker):
    path = _damaged(tmp_path, "flipped", "NONE", 2_000, _overwrite_middle(b"\xff" * 8))  # same size: CRC only
    intact = helpers.write_snapshot(tmp_path, "intact", helpers.id_batches([200] * 3), compression="NONE")
    checked = reader.distributed_dataset(
        path,
        50,
        read=reader.ReadOptions(verify_checksums=True),
        service=reader.ServiceOptions(address=one_worker, timeout_seconds=5),
    )
    with pytest.raises(SnapfeedError, match=r"worker grpc://.* failed: .*shard-.*CRC32C .* \(corrupt bytes\)"):
        list(checked)
    by_block = reader.distributed_dataset(
        path, 50, service=one_worker, read=reader.ReadOptions(verify_checksums="blocks")
    )
    with pytest.raises(SnapfeedError, match=r"worker grpc://.* failed: .*block \d+ .*CRC32C"):
        list(by_block)
    unchecked = reader.distributed_dataset(path, 50, service=one_worker)
    assert sum(len(batch["id"]) for batch in unchecked) == 600, "unchecked, as local reads: sizes only"
    verified = reader.distributed_dataset(
        intact, 50, service=one_worker, read=reader.ReadOptions(verify_checksums=True)
    )
    assert ids_of(verified) == {i: 1 for i in range(600)}


def test_a_corrupt_compressed_block_is_one_error_at_once_not_an_outage(tmp_path, one_worker):
    path = _damaged(tmp_path, "zstd", "ZSTD", 4_000, _overwrite_middle(b"\x13\x37" * 16))
    dataset = reader.distributed_dataset(
        path, 50, service=reader.ServiceOptions(address=one_worker, timeout_seconds=30)
    )
    with pytest.raises(SnapfeedError, match=r"worker grpc://.* failed: block \d+ of shard .* is unreadable") as err:
        list(dataset)
    assert "unreachable" not in str(err.value), "corrupt data is not retried as if the worker were down"
