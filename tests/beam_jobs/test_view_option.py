"""``--view=VIEW [--view_keep=N]``: the job adds the snapshot it wrote or reused to a view (``schemas.views``).

Real DirectRunner jobs on small daily inputs (200 rows a day, ids unique across days), read back from the
view's versions and their members' shards.
"""

from __future__ import annotations

import collections
import os

import pytest

from beam_jobs import materialize
from schemas import metadata, views
from schemas.errors import SnapfeedError, UsageError
from schemas.paths import SnapshotPaths
from tests import helpers
from tests.beam_jobs.test_cli_errors import assert_one_clear_line

ROWS_PER_DAY = 200


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """Three days of raw TFRecords (day d holds ids d*200 .. d*200+199) and their schema."""
    raw = tmp_path_factory.mktemp("raw")
    for day in range(3):
        helpers.write_tfrecords(raw / f"day{day}", num_rows=ROWS_PER_DAY, num_files=1, start=day * ROWS_PER_DAY)
    return raw, helpers.write_schema(raw / "schema.pbtxt")


def day_flags(days, day: int, output, *extra: str) -> list[str]:
    raw, schema = days
    return [
        f"--input={raw / f'day{day}'}/*.tfrecord",
        f"--schema={schema}",
        f"--output={output}",
        f"--snapshot_name=day{day}",
        "--progress_interval_seconds=0",
        *extra,
    ]


def ids_of(version: views.Version) -> collections.Counter:
    """Every id of every row the version's members hold, counted."""
    counted: collections.Counter = collections.Counter()
    for member in version.members:
        snapshot = SnapshotPaths(os.path.dirname(member.directory), member.snapshot_id)
        assert snapshot.directory == member.directory
        assert metadata.read_manifest(snapshot).run_id == member.run_id
        for key, count in helpers.snapshot_rows(snapshot.root, snapshot.snapshot_id).items():
            counted[int.from_bytes(dict(key)["id"], "little", signed=True)] += count
    return counted


def test_a_day_is_added_once_and_the_next_day_makes_the_next_version(days, tmp_path):
    output, view = tmp_path / "daily", str(tmp_path / "views" / "daily")

    first = materialize.run(day_flags(days, 0, output, f"--view={view}"))
    assert (first.state, first.view_version.number, first.view_added) == ("written", 1, True)
    assert first.summary().endswith(f" view={view}@1")
    assert [m.run_id for m in first.view_version.members] == [first.run_id]

    rerun = materialize.run(day_flags(days, 0, output, f"--view={view}"))
    assert (rerun.state, rerun.view_version.number, rerun.view_added) == ("reused", 1, False)
    assert rerun.summary().endswith(f" view={view}@1"), "the version that holds the snapshot"
    assert views.version_numbers(view) == [1], "a rerun of the same day adds nothing"

    second = materialize.run(day_flags(days, 1, output, f"--view={view}"))
    assert (second.state, second.view_version.number, second.view_added) == ("written", 2, True)
    latest = views.read_version(view)
    assert latest.number == 2 and [m.directory for m in latest.members] == [first.path, second.path]
    assert ids_of(latest) == collections.Counter(range(2 * ROWS_PER_DAY)), "both days' rows, each once"
    assert ids_of(views.read_version(view, 1)) == collections.Counter(range(ROWS_PER_DAY)), "version 1 is unchanged"


def test_view_keep_keeps_the_newest_snapshots(days, tmp_path):
    output, view = tmp_path / "daily", str(tmp_path / "views" / "newest")
    for day in range(3):
        result = materialize.run(day_flags(days, day, output, f"--view={view}", "--view_keep=2"))
        assert result.view_version.number == day + 1
    assert [m.snapshot_id for m in views.read_version(view).members] == ["day1", "day2"]
    assert ids_of(views.read_version(view)) == collections.Counter(range(ROWS_PER_DAY, 3 * ROWS_PER_DAY))

    # A reused snapshot goes into another view the same way; --view_keep=1 keeps it alone.
    single = str(tmp_path / "views" / "single")
    for day in (0, 1):
        reused = materialize.run(day_flags(days, day, output, f"--view={single}", "--view_keep=1"))
        assert reused.state == "reused" and reused.view_added
    assert [(v, [m.snapshot_id for m in views.read_version(single, v).members]) for v in (1, 2)] == [
        (1, ["day0"]),
        (2, ["day1"]),
    ]


def test_a_view_that_cannot_be_written_is_one_line_after_the_snapshot_is_committed(days, tmp_path):
    output, blocker = tmp_path / "daily", tmp_path / "blocker"
    blocker.write_text("a file where the view's folder would go")
    view = blocker / "view"

    completed = helpers.run_materialize(*day_flags(days, 0, output, f"--view={view}", "--view_keep=3"))
    line = assert_one_clear_line(completed, 1, "error", str(output / "day0"), "is committed", str(view))
    assert f"`snapfeed view add {view} {output / 'day0'} --keep=3`" in line, "what to do"
    manifest = metadata.read_manifest(SnapshotPaths(str(output), "day0"))
    assert manifest is not None and manifest.num_rows == ROWS_PER_DAY, "the snapshot is not lost"

    with pytest.raises(SnapfeedError, match="state=reused.* could not be added to the view"):
        materialize.run(day_flags(days, 0, output, f"--view={view}"))

    fixed = str(tmp_path / "views" / "daily")
    rerun = materialize.run(day_flags(days, 0, output, f"--view={fixed}"))
    assert (rerun.state, rerun.run_id, rerun.view_version.number) == ("reused", manifest.run_id, 1)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--view_keep=2"], "--view_keep needs --view"),
        (["--view=VIEW", "--view_keep=0"], "--view_keep=0: keep at least the newest snapshot"),
        (["--view=OUTPUT"], "is the --output root"),
    ],
)
def test_view_flag_mistakes_are_usage_errors_before_anything_runs(days, tmp_path, flags, message):
    output = tmp_path / "daily"
    flags = [f.replace("VIEW", str(tmp_path / "view")).replace("OUTPUT", str(output)) for f in flags]
    with pytest.raises(UsageError, match=message):
        materialize.plan(day_flags(days, 0, output, *flags))
    assert not output.exists()
