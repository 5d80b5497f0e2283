"""tf.Transform over a view's window: each day analyzes only its own raw input, and the view version's graph
merges the days' analyzer caches into what analyzing every day's raw rows at once gives.

Real DirectRunner jobs over three small days of tf.Examples (ids unique across days, so the days' statistics
differ); the old days' raw inputs are deleted before the third day runs, so nothing can read them.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import reader
from beam_jobs import materialize
from beam_jobs.preprocessing import tft_window
from reader.snapshots import main as snapfeed_tool
from schemas import metadata, views
from schemas.paths import SnapshotPaths
from tests import helpers

ROWS_PER_DAY = 200
FN = "--tft_preprocessing_fn=tests.prep_tft_window:window"


def _flags(raw, schema, pattern: str, output, name: str, *extra: str) -> list[str]:
    return [
        f"--input={raw}/{pattern}",
        f"--schema={schema}",
        f"--output={output}",
        f"--snapshot_name={name}",
        "--progress_interval_seconds=0",
        FN,
        *extra,
    ]


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    """Three daily runs into one view (the old days' raw input deleted before the third), and one cacheless
    run over all three days' raw input at once, for comparison."""
    root = tmp_path_factory.mktemp("tft-window")
    raw, everything = root / "raw", root / "all"
    for day in range(3):
        helpers.write_tfrecords(raw / f"day{day}", num_rows=ROWS_PER_DAY, num_files=1, start=day * ROWS_PER_DAY)
        shutil.copytree(raw / f"day{day}", everything / f"day{day}")
    schema = helpers.write_schema(root / "schema.pbtxt")
    view, output = str(root / "views" / "daily"), root / "daily"
    results = []
    for day in range(3):
        if day == 2:
            shutil.rmtree(raw / "day0")
            shutil.rmtree(raw / "day1")
        flags = _flags(raw, schema, f"day{day}/*.tfrecord", output, f"day{day}", f"--view={view}")
        results.append(materialize.run(flags))
    combined = materialize.run(_flags(everything, schema, "day*/*.tfrecord", root / "all-out", "all"))
    return view, results, combined


def _analyzer(values: list[dict], label: str):
    return next(entry["value"] for entry in values if entry["label"] == label)


def test_the_third_day_analyzes_only_its_own_raw_input(window):
    view, results, _ = window
    third = results[2]
    assert (third.state, third.view_version.number, third.view_added) == ("written", 3, True)
    manifest = metadata.read_manifest(SnapshotPaths(third.path.rsplit("/", 1)[0], "day2"))
    assert third.tft_analysis["rows"] == ROWS_PER_DAY, "the run's analysis got the new day's rows only"
    assert third.tft_analysis["raw_input_bytes"] == manifest.raw_input_bytes
    # The Arrow bytes the analyzers were fed: one day's three int64/float32 columns, not three days'.
    assert third.tft_analysis["arrow_bytes"] < 2 * results[0].tft_analysis["arrow_bytes"]
    graph = third.view_version.transform_graph
    assert graph["analyzed"]["raw_rows"] == 0, "the window analysis read caches only"
    assert [day["directory"] for day in graph["analyzed"]["days"]] == [r.path for r in results]
    assert all(day["cache_bytes"] > 0 for day in graph["analyzed"]["days"])


def test_the_window_graph_is_committed_with_the_view_version(window, capsys):
    view, results, _ = window
    for number in (1, 2, 3):
        version = views.read_version(view, number)
        assert [m.run_id for m in version.members] == [r.run_id for r in results[:number]]
        assert version.transform_graph["directory"].startswith(f"graphs/{number:08d}-")
    with open(f"{view}/versions/00000003.json") as stream:
        on_disk = json.load(stream)
    assert on_disk["transform_graph"]["directory"] == views.read_version(view, 3).transform_graph["directory"]
    assert snapfeed_tool(["view", "show", f"{view}@3", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["transform_graph"] == on_disk["transform_graph"]["directory"]  # what `view show` tells of it
    output = reader.transform_output(f"{view}@3")
    assert set(output.transformed_feature_spec()) == {"features_z", "label_id", "id"}
    assert reader.transform_output(view).transform_savedmodel_dir == output.transform_savedmodel_dir


def test_the_window_analyzers_equal_analyzing_all_three_days_at_once(window):
    view, results, combined = window
    window_analyzers = views.read_version(view, 3).transform_graph["analyzers"]
    with open(f"{combined.path}/{combined.run_id}/transform_summary.json") as stream:
        combined_summary = json.load(stream)
    for label in ("mean", "variance"):
        assert _analyzer(window_analyzers, label) == pytest.approx(_analyzer(combined_summary["analyzers"], label))
    ids = np.arange(3 * ROWS_PER_DAY, dtype=np.float32)
    features = np.stack([ids, ids / 2, -ids, np.ones_like(ids)], axis=1)
    assert _analyzer(window_analyzers, "mean") == pytest.approx(features.mean(), rel=1e-5)
    day_one = views.read_version(view, 1).transform_graph["analyzers"]
    assert _analyzer(day_one, "mean") == pytest.approx(features[:ROWS_PER_DAY].mean(), rel=1e-5)

    # Applied at read time to the days' raw rows, the window graph gives the combined snapshot's rows.
    rows = {"id": [], "features": [], "label": []}
    for step in reader.distributed_dataset(f"{view}@3", 128, seed=0, shuffle=False):
        for name in rows:
            rows[name].append(np.asarray(step[name]))
    raw = {name: np.concatenate(parts) for name, parts in rows.items()}
    assert sorted(raw["id"].tolist()) == list(range(3 * ROWS_PER_DAY)), "the days' rows are the raw features"
    transformed = reader.transform_features(reader.transform_output(f"{view}@3"), raw)
    expected = reader.transform_features(reader.transform_output(combined.path), raw)
    np.testing.assert_allclose(transformed["features_z"], expected["features_z"], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(transformed["label_id"], expected["label_id"])
    assert reader.vocabulary(reader.transform_output(f"{view}@3"), "labels") == reader.vocabulary(
        reader.transform_output(combined.path), "labels"
    )


def test_a_day_without_a_cache_is_one_line_naming_it(window, tmp_path):
    view, results, combined = window
    other = str(tmp_path / "view")
    snapshot = SnapshotPaths(combined.path.rsplit("/", 1)[0], "all")
    views.add(other, snapshot, metadata.read_manifest(snapshot))
    from schemas.errors import UsageError

    with pytest.raises(UsageError, match="has no tf.Transform analyzer cache"):
        tft_window.window_graph(lambda inputs: inputs, "m:f", None, other, 2, views.read_version(other).members)


def test_the_window_graph_of_days_in_a_bucket_equals_the_local_one(window, s3_bucket):
    """tf.Transform reads analyzer caches through TensorFlow's filesystems, which have no s3://: the days' caches
    are staged through Beam's FileSystems, so a view and its days on S3 get the same window graph."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    from schemas import paths, storage
    from tests.prep_tft_window import window as fn

    view, _, _ = window
    local = views.read_version(view, 3)
    schema_text = storage.read_bytes(
        f"{view}/{local.transform_graph['directory']}/{paths.TRANSFORM_DIRS[2]}/schema.pbtxt"
    ).decode()
    raw_schema = text_format.Parse(schema_text, schema_pb2.Schema())
    members = []
    for index, member in enumerate(local.members):
        copied = f"{s3_bucket}/days/day{index}/{member.snapshot_id}"
        for entry in _files(member.directory):
            storage.atomic_write(copied + entry[len(member.directory) :], storage.read_bytes(entry))
        members.append(views.Member(copied, member.snapshot_id, member.run_id, member.num_rows))
    graph = tft_window.window_graph(fn, FN.split("=", 1)[1], raw_schema, f"{s3_bucket}/view", 3, tuple(members))
    for label in ("mean", "variance"):
        assert _analyzer(graph["analyzers"], label) == pytest.approx(
            _analyzer(local.transform_graph["analyzers"], label)
        )
    assert [day["directory"] for day in graph["analyzed"]["days"]] == [m.directory for m in members]
    assert all(day["cache_bytes"] > 0 for day in graph["analyzed"]["days"])
    assert storage.exists(f"{s3_bucket}/view/{graph['directory']}/{paths.TRANSFORM_SUMMARY}")


def _files(directory: str) -> list[str]:
    from schemas import storage

    found = []
    for entry in storage.list_dir(directory):
        found += _files(entry.path) if entry.is_dir else [entry.path]
    return found
