import os
import re

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


def test_canonical_local_paths_resolve_home_dots_and_symlinks(tmp_path, monkeypatch):
    real = tmp_path / "real"
    (real / "snap").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    base = os.path.realpath(tmp_path)
    assert paths.canonical(str(tmp_path / "link" / "snap")) == f"{base}/real/snap"
    assert paths.canonical(f"{tmp_path}/real/x/../snap/") == f"{base}/real/snap"
    assert paths.canonical(f"file://{tmp_path}/link/snap") == f"{base}/real/snap"
    monkeypatch.chdir(real)
    assert paths.canonical("snap") == paths.canonical("./snap/.") == f"{base}/real/snap"
    monkeypatch.setenv("HOME", str(tmp_path / "link"))
    assert paths.canonical("~/snap") == f"{base}/real/snap"


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("gs://bucket/snaps/x", "gs://bucket/snaps/x"),
        ("GS://bucket/snaps/x/", "gs://bucket/snaps/x"),
        ("s3://bucket//snaps///x", "s3://bucket/snaps/x"),
        ("s3://bucket/snaps/./y/../x/.", "s3://bucket/snaps/x"),
        ("gs://bucket/", "gs://bucket"),
        ("gs://bucket/snaps/..", "gs://bucket"),
        ("s3://bucket/snaps/x?region=eu-west-1", "s3://bucket/snaps/x?region=eu-west-1"),
    ],
)
def test_canonical_uris_keep_their_bucket_and_normalize_the_key(uri, expected):
    assert paths.canonical(uri) == expected


@pytest.mark.parametrize(
    "uri, problem",
    [
        ("gs://bucket/..", "climbs above its bucket gs://bucket"),
        ("s3://bucket/snaps/../../other-bucket/x", "climbs above its bucket s3://bucket"),
        ("gs://bucket/./../x", "climbs above its bucket"),
        ("gs:///snaps/x", "names no bucket"),
        ("s3://../bucket/x", "names no bucket"),
    ],
)
def test_canonical_refuses_uris_outside_any_bucket(uri, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        paths.canonical(uri)


@pytest.mark.parametrize(
    "path, root, inside",
    [
        ("/data/snap", "/data/snap", True),
        ("/data/snap/x", "/data/snap/", True),
        ("/data/snap/a/../x", "/data/snap", True),
        ("/data/snapshots/x", "/data/snap", False),
        ("/data/snap/../other/x", "/data/snap", False),
        ("/data", "/data/snap", False),
        ("/anything", "/", True),
        ("gs://bucket/snaps/x", "gs://bucket/snaps", True),
        ("gs://bucket/x", "gs://bucket", True),
        ("GS://bucket//snaps/./x/", "gs://bucket/snaps/", True),
        ("gs://bucket/snapshots/x", "gs://bucket/snaps", False),
        ("gs://bucket-2/x", "gs://bucket", False),
        ("s3://b/x", "gs://b", False),
        ("s3://bucket/snaps/../other/x", "s3://bucket/snaps", False),
        ("s3://bucket/snaps/x?endpoint_override=elsewhere", "s3://bucket/snaps", False),
        ("/bucket/snaps/x", "gs://bucket/snaps", False),
        ("gs://bucket/snaps/x", "/", False),
    ],
)
def test_is_within_compares_folders_of_one_scheme_and_bucket(path, root, inside):
    assert paths.is_within(path, root) is inside


def test_is_within_follows_symlinks_out_of_and_into_a_root(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "snap").mkdir(parents=True)
    (outside / "secret").mkdir(parents=True)
    (root / "escape").symlink_to(outside)
    (outside / "into-root").symlink_to(root / "snap")
    assert paths.is_within(str(root / "snap"), str(root))
    assert not paths.is_within(str(root / "escape" / "secret"), str(root))
    assert paths.is_within(str(outside / "into-root"), str(root))
    assert paths.is_within(str(root / "snap"), str(outside / ".." / "root"))


def test_is_within_refuses_a_uri_climbing_above_its_bucket():
    with pytest.raises(ValueError, match="climbs above its bucket"):
        paths.is_within("gs://bucket/../other/x", "gs://bucket")
