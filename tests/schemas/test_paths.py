import pytest

from schemas import paths
from schemas.paths import SnapshotPaths


def test_local_layout():
    snap = SnapshotPaths("/saved/data", "abc")
    assert snap.pending_marker == "/saved/data/abc/snapshot.metadata"
    assert snap.final_marker == "/saved/data/abc/metadata.final"
    assert snap.shard("run-1", "shard-x-00000.arrow") == "/saved/data/abc/run-1/shard-x-00000.arrow"
    assert snap.relative(snap.shard("run-1", "s.arrow")) == "run-1/s.arrow"
    assert snap.absolute("run-1/s.arrow") == "/saved/data/abc/run-1/s.arrow"


def test_uri_layout_uses_slashes():
    snap = SnapshotPaths("gs://bucket/root", "abc")
    assert snap.final_marker == "gs://bucket/root/abc/metadata.final"
    assert paths.scheme(snap.final_marker) == "gs"
    assert snap.relative("gs://bucket/root/abc/run-1/s.arrow") == "run-1/s.arrow"


def test_relative_refuses_outside_paths():
    with pytest.raises(ValueError, match="not inside"):
        SnapshotPaths("/a", "b").relative("/elsewhere/x")


def test_temp_names_are_recognized():
    temp = paths.temp_name_for("/a/b/shard-1.arrow", "tok")
    assert temp == "/a/b/.tmp-tok-shard-1.arrow"
    assert paths.is_temp_name(temp)
    assert not paths.is_temp_name("/a/b/shard-1.arrow")
    assert paths.temp_target(temp) == "shard-1.arrow"
    assert paths.temp_target("/a/b/shard-1.arrow") == ""


@pytest.mark.parametrize(
    "name, ok",
    [
        (paths.shard_name("0123456789ab", 7), True),
        ("shard-a-00000.arrow", True),
        ("shard-a-00000.arrow.bak", False),
        ("shard.arrow", False),
        ("notes.txt", False),
    ],
)
def test_shard_names_are_recognized(name, ok):
    """gc deletes only run directories that hold nothing but these (and their temps)."""
    assert paths.is_shard_name(name) is ok


def test_marker_names_are_recognized():
    assert paths.is_marker_name("/r/s/snapshot.metadata") and paths.is_marker_name("metadata.final")
    assert not paths.is_marker_name("metadata.final.bak")


@pytest.mark.parametrize(
    "name, ok", [("daily-2026", True), ("a" * 128, True), ("../x", False), ("", False), ("a/b", False)]
)
def test_snapshot_id_validation(name, ok):
    assert paths.is_valid_snapshot_id(name) is ok
