import json

import pytest

from schemas import metadata
from schemas.errors import CorruptSnapshotError, FormatVersionError
from schemas.snapshot_pb2 import Manifest, ShardInfo


def test_json_is_sorted_and_round_trips():
    manifest = Manifest(format_version="1.0", run_id="run-1", num_rows=3, shards=[ShardInfo(path="a", crc32c=7)])
    data = metadata.to_json(manifest)
    keys = list(json.loads(data))
    assert keys == sorted(keys)
    assert metadata.from_json(data, Manifest, "x") == manifest


def test_newer_major_version_is_refused_with_upgrade_advice():
    data = json.dumps({"format_version": "2.0", "run_id": "r"}).encode()
    with pytest.raises(FormatVersionError, match="format 2.0, newer.*Upgrade snapfeed"):
        metadata.from_json(data, Manifest, "/x/metadata.final")


def test_newer_minor_version_is_read():
    data = json.dumps({"format_version": "1.7", "run_id": "r", "future_field": 1}).encode()
    assert metadata.from_json(data, Manifest, "x").run_id == "r"


def test_garbled_json_names_the_file():
    with pytest.raises(CorruptSnapshotError, match="/x/metadata.final is not valid JSON"):
        metadata.from_json(b"{not json", Manifest, "/x/metadata.final")
