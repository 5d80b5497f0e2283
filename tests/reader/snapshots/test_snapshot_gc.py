"""``gc`` and ``list`` on snapshot directories made by the commit protocol itself (no Beam).

Ages are set with ``os.utime`` (files) and ``begin_run(now=...)`` (markers), so
"30 days old" is on disk exactly as a month-old run would be, and every test
can ask what gc plans at "now" and a little after the grace period.
"""

import json
import os
import pathlib
import shutil
import time

import pyarrow as pa

from beam_jobs.writing import commit
from beam_jobs.writing.commit import RunSpec, WrittenShard
from reader.snapshots import gc, inventory, main
from schemas import metadata, paths, storage, views
from schemas.paths import SnapshotPaths
from schemas.shard_codec import ShardStats

DAY = 86400.0
WEEK = 7 * DAY
SCHEMA = pa.schema([("id", pa.int64())])


def write_temp_marker(marker: str, data: bytes) -> None:
    """A marker still under its temp name, as a writer killed mid-write leaves it."""
    pathlib.Path(paths.temp_name_for(marker, "0123456789ab")).write_bytes(data)


def run_tool(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def age(path: pathlib.Path, days: float) -> None:
    """Backdates ``path`` and everything under it, as if written ``days`` ago."""
    when = time.time() - days * DAY
    for child in sorted(path.rglob("*"), reverse=True):
        os.utime(child, (when, when))
    os.utime(path, (when, when))


def write_shard(run: RunSpec, index: int = 0) -> WrittenShard:
    """A shard file under the name the real writer gives it, reported as the writer reports it."""
    path = pathlib.Path(run.paths.shard(run.run_id, f"shard-0123456789ab-{index:05d}.arrow"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * 5)
    return WrittenShard(str(path), ShardStats(5, 5, (5,), 123), SCHEMA.serialize().to_pybytes())


def finalized_run(root, snapshot_id: str, *, supersedes: str = "", days_ago: float = 0) -> RunSpec:
    """A run committed through begin_run/finalize (a forced write when ``supersedes`` is set).

    With ``days_ago`` the markers' times and every file's mtime say it was written then.
    """
    run = RunSpec(root=str(root), snapshot_id=snapshot_id, run_id=commit.new_run_id(), supersedes_run_id=supersedes)
    then = time.time() - days_ago * DAY
    commit.begin_run(run, now=then)
    outcome = commit.finalize(run, [write_shard(run)], compression="lz4")
    assert outcome.committed, outcome.reason
    if days_ago:
        manifest = metadata.read_manifest(run.paths)
        manifest.finalize_time = then + 60
        storage.atomic_write(run.paths.final_marker, metadata.to_json(manifest))
        age(pathlib.Path(run.paths.directory), days_ago)
    return run


def planned(root, *, now: float, older_than: float = WEEK) -> list[str]:
    entries = inventory.scan(str(root), now=now)
    return [removal.path for removal in gc.plan_removals(entries, now=now, older_than_seconds=older_than)]


def states(root) -> dict[str, str]:
    return {e.snapshot_id: e.state for e in inventory.scan(str(root), now=time.time())}


# --- things that are not snapfeed's --------------------------------------------------------------


def test_a_folder_without_markers_is_not_snapfeeds_and_gc_leaves_it_alone(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "important.txt").write_text("hi")
    age(notes, 30)
    assert states(tmp_path) == {"notes": inventory.UNKNOWN}
    assert planned(tmp_path, now=time.time()) == []
    assert planned(tmp_path, now=time.time() + 365 * DAY, older_than=0) == []

    code, text, _ = run_tool(capsys, "gc", tmp_path, "--dry-run")
    assert code == 0 and "would remove 0 item(s)" in text
    assert f"left {notes} alone: not snapfeed's" in text
    code, out, _ = run_tool(capsys, "gc", tmp_path, "--older-than=0s", "--json")
    assert json.loads(out)["planned"] == [] and (notes / "important.txt").read_text() == "hi"

    code, text, _ = run_tool(capsys, "list", tmp_path)
    assert "unknown (not snapfeed's)" in text


def test_a_writer_between_making_its_directory_and_its_marker_is_left_alone(tmp_path):
    """begin_run makes the snapshot directory, then writes snapshot.metadata under a temp name."""
    snapshot = SnapshotPaths(str(tmp_path), "snap")
    storage.make_dirs(snapshot.directory)
    assert states(tmp_path) == {"snap": inventory.UNKNOWN}, "an empty folder proves nothing"
    assert planned(tmp_path, now=time.time()) == []

    write_temp_marker(snapshot.pending_marker, b'{"format_version": "1.0"')  # the writer's temp marker
    assert states(tmp_path) == {"snap": inventory.ABANDONED}
    assert planned(tmp_path, now=time.time()) == [], "a fresh temp marker is inside the grace period"
    assert planned(tmp_path, now=time.time() + 8 * DAY) == [snapshot.directory]


def test_an_abandoned_snapshot_holding_a_foreign_file_is_left_alone(tmp_path, capsys):
    run = finalized_run(tmp_path, "snap")
    (tmp_path / "snap" / "metadata.final").unlink()
    (tmp_path / "snap" / "snapshot.metadata").unlink()
    (tmp_path / "snap" / "README.txt").write_text("my notes about this data")
    age(tmp_path / "snap", 30)
    assert states(tmp_path) == {"snap": inventory.ABANDONED}
    assert planned(tmp_path, now=time.time()) == []
    code, text, _ = run_tool(capsys, "gc", tmp_path, "--older-than=0s")
    assert "holds files snapfeed did not write (README.txt)" in text
    assert (tmp_path / "snap" / run.run_id).exists() and (tmp_path / "snap" / "README.txt").exists()

    (tmp_path / "snap" / "README.txt").unlink()
    age(tmp_path / "snap", 30)
    assert planned(tmp_path, now=time.time()) == [str(tmp_path / "snap")], "only snapfeed's files: it may go"


def test_an_orphan_run_holding_a_foreign_file_is_left_alone(tmp_path):
    finalized_run(tmp_path, "snap", days_ago=30)
    orphan = RunSpec(root=str(tmp_path), snapshot_id="snap", run_id=commit.new_run_id())
    write_shard(orphan)
    (tmp_path / "snap" / orphan.run_id / "notes.txt").write_text("keep me")
    age(tmp_path / "snap", 30)
    assert planned(tmp_path, now=time.time()) == []
    (tmp_path / "snap" / orphan.run_id / "notes.txt").unlink()
    age(tmp_path / "snap", 30)
    assert planned(tmp_path, now=time.time()) == [orphan.paths.run_dir(orphan.run_id)]


# --- superseded runs: the grace period starts when they were superseded ---------------------------


def test_a_superseded_run_with_old_files_keeps_the_whole_grace_period(tmp_path, capsys):
    old = finalized_run(tmp_path, "snap", days_ago=30)
    new = finalized_run(tmp_path, "snap", supersedes=old.run_id)
    old_dir = old.paths.run_dir(old.run_id)
    superseded_at = time.time()

    assert planned(tmp_path, now=superseded_at) == [], "readers that just opened the old manifest need it"
    assert planned(tmp_path, now=superseded_at + 6 * DAY) == []
    assert planned(tmp_path, now=superseded_at + 8 * DAY) == [old_dir]
    run_tool(capsys, "gc", tmp_path)
    assert os.path.exists(old_dir) and os.path.exists(new.paths.run_dir(new.run_id))


def test_a_run_superseded_twice_keeps_the_grace_period_from_the_newest_commit(tmp_path):
    """After two forced writes the first run is only an orphan, but it was live until the second run's commit."""
    first = finalized_run(tmp_path, "snap", days_ago=30)
    second = finalized_run(tmp_path, "snap", supersedes=first.run_id)
    third = finalized_run(tmp_path, "snap", supersedes=second.run_id)
    now = time.time()
    assert planned(tmp_path, now=now) == []
    assert sorted(planned(tmp_path, now=now + 8 * DAY)) == sorted(
        [first.paths.run_dir(first.run_id), second.paths.run_dir(second.run_id)]
    )
    assert os.path.exists(third.paths.run_dir(third.run_id))


def test_remove_rechecks_the_grace_period_against_the_markers_on_disk(tmp_path):
    """A plan made before a forced write must not delete the run that write just superseded."""
    old = finalized_run(tmp_path, "snap", days_ago=30)
    orphan = RunSpec(root=str(tmp_path), snapshot_id="snap", run_id=commit.new_run_id())
    write_shard(orphan)
    age(tmp_path / "snap", 30)
    now = time.time()
    removals = gc.plan_removals(inventory.scan(str(tmp_path), now=now), now=now, older_than_seconds=WEEK)
    assert [r.path for r in removals] == [orphan.paths.run_dir(orphan.run_id)]
    finalized_run(tmp_path, "snap", supersedes=old.run_id)  # commits between the plan and the removal
    removed, skipped = gc.remove(removals, now=now, older_than_seconds=WEEK, expiry_seconds=DAY)
    assert removed == [] and skipped == removals
    assert os.path.exists(orphan.paths.run_dir(orphan.run_id))


# --- failed and abandoned snapshots in list and gc ------------------------------------------------


def test_list_and_gc_of_failed_and_abandoned_snapshots(tmp_path, capsys):
    failed = RunSpec(root=str(tmp_path), snapshot_id="failed-one", run_id=commit.new_run_id())
    commit.begin_run(failed, now=time.time() - 30 * DAY)
    write_shard(failed)
    commit.mark_failed(failed, "preprocessing_fn raised")
    abandoned = SnapshotPaths(str(tmp_path), "abandoned-one")
    storage.make_dirs(abandoned.directory)
    write_temp_marker(abandoned.pending_marker, b"{")

    code, out, _ = run_tool(capsys, "list", tmp_path, "--json")
    rows = {row["id"]: row for row in json.loads(out)}
    assert code == 0 and {k: v["state"] for k, v in rows.items()} == {
        "failed-one": "failed",
        "abandoned-one": "abandoned",
    }
    assert rows["failed-one"]["run_id"] == failed.run_id and rows["failed-one"]["bytes"] == 5
    assert rows["abandoned-one"]["created"] is None

    code, text, _ = run_tool(capsys, "gc", tmp_path)
    assert "removed 0 item(s)" in text, "the failure was just recorded: inside the grace period"
    age(tmp_path / "failed-one", 8)
    age(tmp_path / "abandoned-one", 8)
    code, text, _ = run_tool(capsys, "gc", tmp_path)
    assert "snapshot failed-one is failed" in text and "snapshot abandoned-one is abandoned" in text
    assert sorted(os.listdir(tmp_path)) == []


# --- views: a run a view version lists is never removed ----------------------------------------------


def test_a_superseded_run_a_view_version_lists_is_kept_and_said_so(tmp_path, capsys):
    """gc keeps a superseded run while any version of a view lists it, says which, and removes it once none
    does; the view's hold file in the run is snapfeed's, not a foreign file."""
    old = finalized_run(tmp_path, "snap", days_ago=30)
    view = str(tmp_path / "views" / "daily")
    views.add(view, old.paths, metadata.read_manifest(old.paths))
    new = finalized_run(tmp_path, "snap", supersedes=old.run_id)
    old_dir = old.paths.run_dir(old.run_id)
    later = time.time() + 8 * DAY
    assert planned(tmp_path, now=later) == []
    code, out, _ = run_tool(capsys, "gc", tmp_path, "--older-than", "0s")
    assert code == 0 and os.path.exists(old_dir)
    assert f"left {old_dir} alone: superseded run listed by view version {view}@1" in out
    assert "did not write" not in out

    shutil.rmtree(view)  # no view lists the old run any more: it goes like any superseded run
    assert planned(tmp_path, now=later) == [old_dir]
    assert os.path.exists(new.paths.run_dir(new.run_id))
