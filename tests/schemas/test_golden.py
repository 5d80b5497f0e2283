"""The committed golden snapshots, one per format version, still read exactly as written: the format is pinned."""

import numpy as np
import pytest

from schemas import columns, metadata, shard_codec, storage
from schemas.paths import SnapshotPaths
from tests.golden.make_golden import ROOT, golden_batch

GOLDENS = {"1.0": SnapshotPaths(str(ROOT), "golden"), "1.1": SnapshotPaths(str(ROOT), "golden-1.1")}


@pytest.fixture(params=sorted(GOLDENS))
def golden(request):
    return request.param, GOLDENS[request.param]


def test_manifest_fields(golden):
    version, snapshot = golden
    manifest = metadata.read_manifest(snapshot)
    assert manifest.format_version == version and manifest.complete and manifest.compression == "lz4"
    assert manifest.num_rows == 20 and manifest.snapshot_name == snapshot.snapshot_id
    assert [(c.name, c.dtype, list(c.shape)) for c in manifest.columns] == [
        ("id", "int64", []),
        ("image", "uint8", [2, 2, 3]),
        ("score", "float32", []),
        ("name", "binary", []),
    ]
    assert sum(s.num_rows for s in manifest.shards) == 20
    # 1.1 adds a CRC32C per block (checked against the shard's bytes by the reader's tests of the goldens)
    assert [len(s.block_crc32c) for s in manifest.shards] == [
        len(s.block_rows) if version >= "1.1" else 0 for s in manifest.shards
    ]


def test_shards_match_checksums_and_decode_to_the_written_rows(golden):
    _, snapshot = golden
    manifest = metadata.read_manifest(snapshot)
    decoded = []
    for shard in manifest.shards:
        path = snapshot.absolute(shard.path)
        with storage.open_random_access(path) as handle:
            assert shard_codec.checksum_file(handle) == (shard.crc32c, shard.num_bytes)
        with storage.open_random_access(path) as handle:
            reader = shard_codec.open_shard(handle, path)
            assert [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)] == list(shard.block_rows)
            decoded += [columns.batch_to_numpy(reader.get_batch(i)) for i in range(reader.num_record_batches)]
    got = {name: np.concatenate([d[name] for d in decoded]) for name in decoded[0]}
    order = np.argsort(got["id"])
    expected = {name: np.concatenate([columns.batch_to_numpy(golden_batch(s))[name] for s in (0, 10)]) for name in got}
    for name in got:
        np.testing.assert_array_equal(got[name][order], expected[name])
    assert got["image"].shape == (20, 2, 2, 3)
