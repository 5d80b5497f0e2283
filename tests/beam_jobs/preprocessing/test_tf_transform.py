"""``--tft_preprocessing_fn``: tf.Transform's Analyze and Transform in the real job, the graph committed with the run.

Each analyzer's result is checked against NumPy over the raw rows; the graph's
serving layer, built under ``MirroredStrategy.scope()``, must give the rows the
snapshot holds (no training/serving skew); a rerun reuses the snapshot and its
graph; every mistake is one line before anything is written.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import reader
from beam_jobs import materialize
from reader.core.snapshot import open_snapshot
from schemas import metadata, paths
from schemas.snapshot_pb2 import RunState
from tests import helpers, prep_tft

ROWS = 2000


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> dict:
    directory = tmp_path_factory.mktemp("tft_raw")
    columns = prep_tft.write_categories_csv(directory / "rows.csv", ROWS)
    return {"path": directory / "rows.csv", "columns": columns}


def job_flags(raw, root, function: str = "categories") -> list[str]:
    return [
        f"--input={raw['path']}",
        "--input_format=csv",
        f"--tft_preprocessing_fn=tests.prep_tft:{function}",
        f"--output={root}",
        "--progress_interval_seconds=0",
    ]


@pytest.fixture(scope="module")
def job(raw, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tft_snapshots")
    result = materialize.run(job_flags(raw, root))
    assert (result.state, result.rows) == ("written", ROWS)
    rows = next(iter(reader.distributed_dataset(result.path, ROWS, shuffle=False)))
    order = np.argsort(rows["id"])
    return {"root": root, "result": result, "rows": {name: values[order] for name, values in rows.items()}}


def test_each_analyzer_matches_numpy_over_the_raw_rows(raw, job):
    columns, rows = raw["columns"], job["rows"]
    assert np.array_equal(rows["id"], columns["id"])
    x = columns["x"].astype(np.float64)
    np.testing.assert_allclose(rows["x_z"], (x - x.mean()) / x.std(), atol=1e-4)  # the population mean and std
    y = columns["y"]
    np.testing.assert_allclose(rows["y_01"], (y - y.min()) / (y.max() - y.min()), atol=1e-6)
    by_frequency = sorted(prep_tft.FREQUENCIES, key=prep_tft.FREQUENCIES.get, reverse=True)
    assert np.array_equal(rows["category_id"], [by_frequency.index(c) for c in columns["category"]])
    summary = json.loads(
        (job["root"] / job["result"].snapshot_id).glob("run-*/transform_summary.json").__next__().read_text()
    )
    (boundaries,) = [a["value"] for a in summary["analyzers"] if a["label"] == "bucket boundaries"]
    assert len(boundaries) == prep_tft.BUCKETS - 1
    np.testing.assert_allclose(boundaries, np.quantile(y, [0.25, 0.5, 0.75]), rtol=0.05)  # approximate quantiles
    assert np.array_equal(rows["y_bucket"], np.digitize(y, np.asarray(boundaries, np.float32)))
    assert {
        a["label"]: a["value"] for a in summary["analyzers"] if a["label"] in ("mean", "variance")
    } == pytest.approx({"mean": x.mean(), "variance": x.var()}, rel=1e-5)
    (vocabulary,) = summary["vocabularies"]
    assert (vocabulary["name"], vocabulary["size"], vocabulary["top"]) == ("category", 4, by_frequency)


def test_the_graph_served_under_a_strategy_gives_the_snapshots_rows(raw, job):
    import tensorflow as tf

    output = reader.transform_output(job["result"].path)
    features = {name: raw["columns"][name] for name in ("id", "x", "y")}
    features["category"] = raw["columns"]["category"].astype(bytes)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        layer = output.transform_features_layer()
    served = layer({name: tf.constant(values) for name, values in features.items()})
    assert set(served) == set(job["rows"])
    for name, values in served.items():
        np.testing.assert_array_equal(values.numpy(), job["rows"][name], err_msg=name)
    numpy_served = reader.transform_features(job["result"].path, features)
    np.testing.assert_array_equal(numpy_served["category_id"], job["rows"]["category_id"])
    assert reader.vocabulary(output, "category") == ["a", "b", "c", "d"]
    assert set(output.raw_feature_spec()) == {"id", "x", "y", "category"}


def test_the_graph_is_committed_in_the_run_and_a_rerun_reuses_both(raw, job):
    snapshot = open_snapshot(job["result"].path)
    listed = [f.path.split("/", 1)[1] for f in snapshot.metadata.transform_files]
    assert {entry.split("/")[0] for entry in listed} == {*paths.TRANSFORM_DIRS, paths.TRANSFORM_SUMMARY}
    assert all(f.path.startswith(snapshot.metadata.run_id + "/") for f in snapshot.metadata.transform_files)
    assert snapshot.metadata.fingerprint_components.transform_library == "tensorflow-transform==1.21.0"
    assert snapshot.verify() == snapshot.num_shards + len(listed)
    again = materialize.run(job_flags(raw, job["root"]))
    assert (again.state, again.run_id or snapshot.metadata.run_id) == ("reused", snapshot.metadata.run_id)
    assert reader.transform_output(again.path).transform_savedmodel_dir.startswith(snapshot.run_dir)


def test_show_lists_the_analyzers_and_verify_names_a_damaged_graph(raw, job, tmp_path):
    show = helpers.run_module("reader.snapshots", "show", job["result"].path)
    assert show.returncode == 0, show.stderr
    x = raw["columns"]["x"].astype(np.float64)
    assert f"mean: {x.mean():.6g}" in show.stdout and f"variance: {x.var():.6g}" in show.stdout
    assert "vocabulary category: 4 entries; most frequent first: a, b, c, d" in show.stdout
    assert "(tf.Transform, tensorflow-transform==1.21.0)" in show.stdout
    copy = tmp_path / "copy"
    shutil.copytree(job["root"], copy)
    (asset,) = copy.glob("*/run-*/transform_fn/assets/category")
    asset.write_text("d\nc\nb\na\n")  # same size, other bytes: only the checksum tells
    verify = helpers.run_module("reader.snapshots", "verify", str(copy))
    assert verify.returncode == 1 and f"BAD {asset}: CRC32C" in verify.stdout
    with pytest.raises(reader.CorruptSnapshotError, match="tf.Transform graph .* is damaged: .*category: CRC32C"):
        reader.transform_output(str(copy))


def test_a_snapshot_without_a_graph_says_so(tmp_path):
    path = helpers.write_snapshot(tmp_path, "plain", helpers.id_batches([10]))
    with pytest.raises(reader.UsageError, match="has no tf.Transform graph: it was materialized without"):
        reader.transform_output(path)


# --- one line for every mistake, nothing written -------------------------------------------------------------------


def _one_error_line(capsys, argv: list[str]) -> str:
    code = materialize.main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--tft_preprocessing_fn=tests.prep_functions:keep_ids"],
            "is not a tf.Transform preprocessing_fn.*--preprocessing_fn",
        ),
        (["--preprocessing_fn=tests.prep_tft:categories"], "calls tensorflow_transform.*--tft_preprocessing_fn"),
        (["--tft_preprocessing_fn=tests.prep_tft:reads_a_missing_feature"], "reads feature 'no_such_feature', which"),
        (["--tft_preprocessing_fn=tests.prep_tft:vocabulary_of_floats"], "failed while tf.Transform traced it"),
        (
            ["--tft_preprocessing_fn=tests.prep_tft:categories", "--preprocessing_fn=tests.prep_functions:keep_ids"],
            "both given; pass one",
        ),
    ],
)
def test_a_mistake_is_one_line_and_writes_nothing(raw, tmp_path, capsys, flags, message):
    line = _one_error_line(capsys, [f"--input={raw['path']}", "--input_format=csv", f"--output={tmp_path}", *flags])
    assert re.search(message, line), line
    assert list(tmp_path.iterdir()) == []


def test_tfrecord_without_a_schema_is_one_line(tmp_path, capsys):
    digits = helpers.REPO_ROOT / "examples" / "data" / "digits"
    line = _one_error_line(
        capsys, [f"--input={digits}/*.tfrecord", f"--output={tmp_path}", "--tft_preprocessing_fn=tests.prep_tft:digits"]
    )
    assert "TFRecord input needs --schema" in line


KERAS_3_PROGRAM = """
import os, sys
import tensorflow as tf
import reader
from beam_jobs.preprocessing import tf_transform

tf_transform.transform_library()  # the job's first import of tensorflow-transform
layer = reader.transform_output(sys.argv[1]).transform_features_layer()
assert "TF_USE_LEGACY_KERAS" not in os.environ, os.environ["TF_USE_LEGACY_KERAS"]
strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
dataset = reader.distributed_dataset(
    sys.argv[1], 64, strategy=strategy, seed=1, map_fn=lambda batch: ({"x": batch["x_z"]}, batch["y_01"])
)
with strategy.scope():
    inputs = {"x": tf.keras.Input(shape=(), name="x")}
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(tf.keras.layers.Reshape((1,))(inputs["x"])))
    model.compile(optimizer="sgd", loss="mse")
model.fit(dataset.tf_dataset, epochs=1, verbose=0)  # Keras 2 would ask for steps_per_epoch here
import tf_keras
print("keras", tf.keras.version(), "layer", "tf_keras" if isinstance(layer, tf_keras.Model) else type(layer).__mro__)
"""


def test_tensorflow_transform_leaves_a_keras_3_program_on_keras_3(job):
    """tensorflow-transform sets TF_USE_LEGACY_KERAS=1 on import; through snapfeed the program keeps its Keras,
    and the graph's layer is a tf_keras one, as tensorflow-transform 1.21 builds it."""
    completed = subprocess.run(
        [sys.executable, "-c", KERAS_3_PROGRAM, str(job["result"].path)],
        capture_output=True,
        text=True,
        env=helpers.cli_env(),  # the tests' conftest imported tensorflow-transform the same way: no variable to inherit
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert re.search(r"^keras 3\.\S+ layer tf_keras$", completed.stdout, re.M), completed.stdout


def test_an_environment_without_tensorflow_transform_is_one_line(raw, tmp_path):
    shadow = tmp_path / "shadow" / "tensorflow_transform"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'tensorflow_transform'\")\n")
    completed = subprocess.run(
        [sys.executable, "-m", "beam_jobs.materialize", *job_flags(raw, tmp_path / "out")],
        capture_output=True,
        text=True,
        env=helpers.cli_env(PYTHONPATH=f"{shadow.parent}:{helpers.REPO_ROOT}"),
        timeout=300,
    )
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2 and len(lines) == 1, completed.stderr
    assert "needs tensorflow-transform" in lines[0] and "pip install" in lines[0]


@pytest.mark.parametrize("input_format", ["csv", "tfrecord"])
def test_an_input_without_rows_is_one_line(tmp_path, capsys, input_format):
    """CSV: the driver finds no row to infer types from; TFRecord with --schema: the analyzers run over nothing
    and finalize refuses to commit zero rows. Either way one line, and no metadata.final."""
    digits = helpers.REPO_ROOT / "examples" / "data" / "digits"
    if input_format == "csv":
        (tmp_path / "empty.csv").write_text("id,x,y,category\n")
        flags = [
            f"--input={tmp_path / 'empty.csv'}",
            "--input_format=csv",
            "--tft_preprocessing_fn=tests.prep_tft:categories",
        ]
    else:
        (tmp_path / "empty.tfrecord").write_bytes(b"")
        flags = [
            f"--input={tmp_path / 'empty.tfrecord'}",
            f"--schema={digits / 'schema.pbtxt'}",
            "--tft_preprocessing_fn=tests.prep_tft:digits",
        ]
    code = materialize.main([*flags, f"--output={tmp_path / 'out'}", "--progress_interval_seconds=0"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1, lines
    assert "no rows" in lines[0], lines[0]
    assert helpers.final_marker_count(tmp_path / "out") == 0


# --- Ctrl-C in the Analyze phase -----------------------------------------------------------------------------------


@pytest.mark.slow  # 45 s: the Analyze phase held, then interrupted, then rerun
def test_ctrl_c_while_analyzing_leaves_no_graph_and_no_blocking_marker(raw, tmp_path):
    """An analyzer's own Beam step waits at a barrier (``prep_tft.held_in_analysis``), so SIGINT lands while the
    Analyze phase runs: the run is marked failed, nothing of it (graph, shards, tf.Transform's temp files) is left,
    and the rerun writes at once."""
    root, barrier = tmp_path / "out", tmp_path / "barrier"
    barrier.mkdir()
    args = job_flags(raw, root, "held_in_analysis")
    job = helpers.start_materialize(*args, **{prep_tft.BARRIER_ENV: str(barrier)})
    deadline = time.monotonic() + 240
    while not list(barrier.glob("analyzing-*")):
        assert job.poll() is None, job.communicate()
        assert time.monotonic() < deadline, "the job never reached the analyzer's step"
        time.sleep(0.1)
    (directory,) = [p for p in root.iterdir() if p.is_dir()]
    snapshot = paths.SnapshotPaths(str(root), directory.name)
    run_id = metadata.read_pending(snapshot).run_id
    assert not list((directory / run_id).glob("shard-*")), "still analyzing: no shard yet"
    job.send_signal(signal.SIGINT)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1].startswith("error: interrupted by SIGINT"), stderr
    pending = metadata.read_pending(snapshot)
    assert pending.state == RunState.FAILED and metadata.read_manifest(snapshot) is None
    assert not (directory / run_id).exists(), "no graph, no shards"
    assert not pathlib.Path(tempfile.gettempdir(), f"snapfeed-tft-{run_id}").exists(), "tf.Transform's temp files"

    (barrier / "release").touch()
    rerun = helpers.run_materialize(*args, **{prep_tft.BARRIER_ENV: str(barrier)})
    assert rerun.returncode == 0, rerun.stderr
    assert helpers.summary_fields(rerun.stdout)["state"] == "written"
    manifest = metadata.read_manifest(snapshot)
    assert manifest.num_rows == ROWS and manifest.transform_files
    rows = next(iter(reader.distributed_dataset(str(directory), ROWS, columns="rows_analyzed")))
    assert set(rows["rows_analyzed"].tolist()) == {ROWS}, "the analyzer's step saw every row"
