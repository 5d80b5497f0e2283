"""Views (``schemas.views``): numbered versions committed atomically, on local disk and on the S3/GCS emulators.

The manifests here are built, not written by a job: a view records runs and
copies manifests, and never opens a shard (the reader's tests read real ones).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading

import pyarrow as pa
import pytest

from schemas import manifests, paths, storage, views
from schemas.errors import SnapshotNotFoundError, UsageError
from schemas.metadata import FORMAT_VERSION
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import ShardInfo

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(root: str, day: int, run: str = "") -> tuple[SnapshotPaths, object]:
    """A finalized-looking run of snapshot ``day-<day>`` under ``root``: its folder and manifest."""
    snapshot = SnapshotPaths(root, f"day-{day:02d}")
    run_id = run or f"run-{day:012x}"
    storage.make_dirs(snapshot.run_dir(run_id))
    shard = ShardInfo(path=f"{run_id}/shard-a-00000.arrow", num_rows=10 + day, num_bytes=100, block_rows=[10 + day])
    schema = pa.schema([("x", pa.int64())])
    manifest = manifests.build(
        schema, [shard], format_version=FORMAT_VERSION, snapshot_id=snapshot.snapshot_id, run_id=run_id
    )
    return snapshot, manifest


@pytest.fixture(params=["local", "s3", "gs"])
def root(request, tmp_path) -> str:
    """Local disk, or a fresh bucket on the S3 or the GCS emulator (conditional writes of their own)."""
    if request.param == "local":
        return str(tmp_path)
    return request.getfixturevalue("s3_bucket" if request.param == "s3" else "gcs_bucket")


def test_versions_are_numbered_kept_to_the_newest_and_never_change(root):
    view = paths.join(root, "views", "daily")
    for day in range(4):
        version, added = views.add(view, *_run(root, day), keep=3)
        assert added and version.number == day + 1
    assert views.version_numbers(view) == [1, 2, 3, 4]
    latest = views.read_version(view)
    assert [m.snapshot_id for m in latest.members] == ["day-01", "day-02", "day-03"]  # oldest first, kept 3
    assert latest.num_rows == 11 + 12 + 13
    assert [m.snapshot_id for m in views.read_version(view, 2).members] == ["day-00", "day-01"]
    added, dropped = views.difference(views.read_version(view, 1), latest)
    assert [m.snapshot_id for m in added] == ["day-01", "day-02", "day-03"]
    assert [m.snapshot_id for m in dropped] == ["day-00"]


def test_the_same_run_twice_adds_nothing_and_a_rewritten_day_replaces_its_run(root):
    view = paths.join(root, "view")
    views.add(view, *_run(root, 0))
    version, added = views.add(view, *_run(root, 0))
    assert not added and version.number == 1
    rewritten, added = views.add(view, *_run(root, 0, run="run-ffffffffffff"))
    assert added and rewritten.number == 2
    assert [m.run_id for m in rewritten.members] == ["run-ffffffffffff"]
    old = views.read_version(view, 1).members[0]
    assert old.run_id == f"run-{0:012x}"
    assert views.member_manifest(view, old).run_id == old.run_id  # version 1 still reads the run it recorded
    assert views.listed_runs(view) == {("day-00", old.run_id): [1], ("day-00", "run-ffffffffffff"): [2]}
    assert views.holding_views(SnapshotPaths(root, "day-00").run_dir(old.run_id)) == [view]


def test_racing_adds_all_land_in_some_order(root):
    """Eight threads add eight days at once: every day is in the last version, and each version adds one."""
    view = paths.join(root, "raced")
    days = [_run(root, day) for day in range(8)]
    start = threading.Barrier(len(days))

    def add(day):
        start.wait()
        return views.add(view, *day)

    with concurrent.futures.ThreadPoolExecutor(len(days)) as pool:
        results = list(pool.map(add, days))
    assert sorted(version.number for version, _ in results) == list(range(1, 9))
    assert all(added for _, added in results)
    assert sorted(m.snapshot_id for m in views.read_version(view).members) == [f"day-{d:02d}" for d in range(8)]
    for number in range(2, 9):
        older, newer = views.read_version(view, number - 1), views.read_version(view, number)
        added, dropped = views.difference(older, newer)
        assert len(added) == 1 and not dropped


def test_a_graph_made_for_a_version_number_another_add_took_is_deleted(root):
    """Racing adds that each make a graph (``attach``, as tf.Transform windows do) leave only named graphs."""
    view = paths.join(root, "graphs-raced")
    days = [_run(root, day) for day in range(4)]
    start = threading.Barrier(len(days))

    def attach(number, members):
        directory = f"graphs/{number:08d}-{threading.get_ident():x}-{len(members)}"
        storage.atomic_write(paths.join(view, directory, "graph.pb"), b"graph")
        return {"directory": directory}

    def add(day):
        start.wait()
        return views.add(view, *day, attach=attach)

    with concurrent.futures.ThreadPoolExecutor(len(days)) as pool:
        list(pool.map(add, days))
    named = {views.read_version(view, number).transform_graph["directory"] for number in views.version_numbers(view)}
    made = {f"graphs/{entry.name}" for entry in storage.list_dir(paths.join(view, "graphs")) if entry.is_dir}
    assert made == named and len(named) == 4


def test_two_processes_racing_adds_both_land(tmp_path):
    """Two processes add at once, released together by a file: both days land, as versions 1 and 2."""
    view = str(tmp_path / "view")
    for day in range(2):
        _run(str(tmp_path), day)
    program = (
        "import sys, time, pyarrow as pa\n"
        "from tests.schemas.test_views import _run\n"
        "from schemas import views\n"
        "snapshot, manifest = _run(sys.argv[1], int(sys.argv[2]))\n"
        "while not __import__('os').path.exists(sys.argv[3]): time.sleep(0.001)\n"
        "version, added = views.add(sys.argv[4], snapshot, manifest)\n"
        "print(version.number, added)\n"
    )
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", program, str(tmp_path), str(day), str(go), view],
            cwd=ROOT_DIR,
            stdout=subprocess.PIPE,
            text=True,
        )
        for day in range(2)
    ]
    go.write_text("")
    outputs = [proc.communicate(timeout=120)[0].split() for proc in procs]
    assert sorted(outputs) == [["1", "True"], ["2", "True"]]
    assert sorted(m.snapshot_id for m in views.read_version(view).members) == ["day-00", "day-01"]


def test_bad_views_and_versions_are_one_line(tmp_path):
    with pytest.raises(SnapshotNotFoundError, match=r"no view at .*snapfeed view add"):
        views.read_version(str(tmp_path / "nothing"))
    view = str(tmp_path / "view")
    views.add(view, *_run(str(tmp_path), 0))
    with pytest.raises(SnapshotNotFoundError, match=r"has no version 7 \(it has 1..1\)"):
        views.read_version(view, 7)
    with pytest.raises(UsageError, match="keep=0"):
        views.add(view, *_run(str(tmp_path), 1), keep=0)
    version_file = tmp_path / "view" / "versions" / "00000001.json"
    version_file.write_text(json.dumps({"format": 1, "version": 1}))
    with pytest.raises(Exception, match=r"00000001.json is not a view version"):
        views.read_version(view, 1)


def test_pinned_paths_split_at_the_last_at():
    assert views.split_pinned("gs://b/views/daily@12") == ("gs://b/views/daily", 12)
    assert views.split_pinned("/data/v@x") == ("/data/v@x", None)
    assert views.split_pinned("/data/v") == ("/data/v", None)
