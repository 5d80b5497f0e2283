import numpy as np
import pyarrow as pa

from schemas import columns, manifests, metadata
from schemas.snapshot_pb2 import Manifest, ShardInfo


def test_build_stores_the_schema_and_the_shard_totals():
    schema = columns.record_batch_from_arrays({"id": np.arange(2), "image": np.zeros((2, 3, 4), np.uint8)}).schema
    shards = [ShardInfo(path="a", num_rows=2, num_bytes=10), ShardInfo(path="b", num_rows=3, num_bytes=20)]
    manifest = manifests.build(schema, shards, format_version="1.0", run_id="run-1")
    assert manifest.run_id == "run-1" and [s.path for s in manifest.shards] == ["a", "b"]
    assert (manifest.num_rows, manifest.num_bytes) == (5, 30)
    assert list(manifest.columns) == columns.column_specs(schema)
    read_back = metadata.from_json(metadata.to_json(manifest), Manifest, "x")
    assert manifests.arrow_schema(read_back).equals(schema, check_metadata=True)


def test_an_empty_schema_round_trips():
    manifest = manifests.build(pa.schema([]), [])
    assert manifests.arrow_schema(manifest) == pa.schema([]) and manifest.num_rows == 0
