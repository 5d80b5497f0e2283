"""A run that does not commit is reported as what it is, never as "another writer"; paths are the driver's."""

from __future__ import annotations

import importlib.metadata
import pathlib
import shutil
import subprocess

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_jobs import materialize
from schemas import metadata
from schemas.errors import SnapfeedError
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import RunState
from tests import helpers
from tests.beam_jobs.runners.test_runner_checks import sdist_of
from tests.beam_jobs.test_cli_errors import assert_one_clear_line

QUIET = "--progress_interval_seconds=0"


def test_relative_and_absolute_spellings_of_the_same_files_are_one_snapshot(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    pq.write_table(pa.table({"id": np.arange(50)}), tmp_path / "data" / "x.parquet")
    monkeypatch.chdir(tmp_path)
    spellings = [
        ("data/x.parquet", "out"),
        ("./data/x.parquet", "./out"),
        (str(tmp_path / "data" / "x.parquet"), str(tmp_path / "out")),
    ]
    results = [
        materialize.run([f"--input={source}", "--input_format=parquet", f"--output={output}", QUIET])
        for source, output in spellings
    ]
    assert [r.state for r in results] == ["written", "reused", "reused"]
    assert {r.snapshot_id for r in results} == {results[0].snapshot_id}
    assert results[0].path == str(tmp_path / "out" / results[0].snapshot_id), "the output is resolved in the driver"
    components = metadata.read_manifest(SnapshotPaths(str(tmp_path / "out"), results[0].snapshot_id))
    assert list(components.fingerprint_components.input_patterns) == [str(tmp_path / "data" / "x.parquet")]


def _offline(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The job in a network namespace of its own: any connection it tried would fail (no interface is up)."""
    return subprocess.run(
        ["unshare", "--net", *helpers.materialize_command(*args)],
        cwd=helpers.REPO_ROOT,
        env=helpers.cli_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


_DIGITS_DIR = helpers.REPO_ROOT / "examples" / "data" / "digits"
#: The bundled digits as the job's input.
DIGITS = (f"--input={_DIGITS_DIR}/digits-*.tfrecord", f"--schema={_DIGITS_DIR}/schema.pbtxt")
#: ... on Dataflow, as a dry run translates them: no job is submitted.
DIGITS_ON_DATAFLOW = (
    *DIGITS,
    "--runner=DataflowRunner",
    "--dry_run=True",
    "--project=my-project",
    "--region=us-central1",
    "--temp_location=gs://my-bucket/tmp",
)


@pytest.mark.skipif(
    shutil.which("unshare") is None or subprocess.run(["unshare", "--net", "true"], check=False).returncode != 0,
    reason="needs unshare --net (root or user namespaces) to prove the dry run opens no connection",
)
def test_a_dataflow_dry_run_translates_offline_and_stages_what_workers_need(tmp_path):
    prep = sdist_of(tmp_path / "prep", "my_prep/__init__.py")
    job = [
        *DIGITS_ON_DATAFLOW,
        "--preprocessing_fn=my_prep:preprocess",
        f"--extra_package={prep}",
    ]
    local = _offline(*job, f"--output={tmp_path / 'out'}", PYTHONPATH=f"{tmp_path / 'prep'}")
    assert_one_clear_line(local, 2, "usage error", f"--output={tmp_path / 'out'} is a local path", "gs://")
    assert not (tmp_path / "out").exists()

    translated = _offline(*job, "--output=gs://my-bucket/snapshots", PYTHONPATH=f"{tmp_path / 'prep'}")
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert " state=dry run rows=0 " in translated.stdout.splitlines()[-1]
    (staging,) = [line for line in translated.stderr.splitlines() if line.startswith("dry run: workers run ")]
    image, _, installed = staging.removeprefix("dry run: workers run ").partition(" and install ")
    assert image.endswith("beam_python3.11_sdk:" + beam.__version__), staging
    assert {"snapfeed-0.1.0.tar.gz", "my_prep-0.1.tar.gz"} <= set(installed.split(", ")), staging


def test_a_pipeline_that_commits_nothing_is_a_failure_and_blocks_no_rerun(tmp_path, monkeypatch):
    """As when workers cannot reach the output or a runner never runs the finalize step."""
    args = [*DIGITS, f"--output={tmp_path}", QUIET]
    with monkeypatch.context() as patched:
        patched.setattr(materialize, "_run_pipeline", lambda job, run, remote: None)
        with pytest.raises(SnapfeedError, match=r"the pipeline finished but run run-\w+ committed nothing to "):
            materialize.run(args)
    (directory,) = [p for p in pathlib.Path(tmp_path).iterdir() if p.is_dir()]
    assert metadata.read_pending(SnapshotPaths(str(tmp_path), directory.name)).state == RunState.FAILED
    rerun = materialize.run(args)
    assert (rerun.state, rerun.rows) == ("written", 1797)


@pytest.mark.skipif(
    shutil.which("unshare") is None or subprocess.run(["unshare", "--net", "true"], check=False).returncode != 0,
    reason="needs unshare --net (root or user namespaces) to prove the dry run opens no connection",
)
@pytest.mark.slow  # 31 s in the default suite: tracing tf.Transform; the plain dry run stays in it
def test_a_tf_transform_dataflow_dry_run_traces_offline_and_stages_snapfeed_with_tensorflow_transform(tmp_path):
    """tf.Transform traces the function and builds its Analyze/Transform graph in the driver, with its temp dir
    under --temp_location (gs://, touched by no one offline); the workers get snapfeed's sdist, which requires
    tensorflow-transform (its [job] dependencies)."""
    translated = _offline(
        *DIGITS_ON_DATAFLOW,
        "--tft_preprocessing_fn=tests.prep_tft:digits",
        "--output=gs://my-bucket/snapshots",
        PYTHONPATH=str(helpers.REPO_ROOT),
    )
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert " state=dry run rows=0 " in translated.stdout.splitlines()[-1]
    (staging,) = [line for line in translated.stderr.splitlines() if line.startswith("dry run: workers run ")]
    assert "snapfeed-0.1.0.tar.gz" in staging.partition(" and install ")[2].split(", "), staging
    # The staged sdist installs [job] on the workers: tests/test_install.py builds it and reads its requirements.
    assert 'tensorflow-transform==1.21.0; extra == "job"' in importlib.metadata.requires("snapfeed")
