"""A run that does not commit is reported as what it is, never as "another writer"; paths are the driver's."""

from __future__ import annotations

import pathlib

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


def test_a_dataflow_dry_run_translates_and_leaves_no_marker(tmp_path):
    digits = helpers.REPO_ROOT / "examples" / "data" / "digits"
    result = materialize.run(
        [
            f"--input={digits}/digits-*.tfrecord",
            f"--schema={digits}/schema.pbtxt",
            f"--output={tmp_path / 'out'}",
            "--runner=DataflowRunner",
            "--dry_run=True",
            "--project=my-project",
            "--region=us-central1",
            "--temp_location=gs://my-bucket/tmp",
            QUIET,
        ]
    )
    assert (result.state, result.rows, result.in_progress) == ("dry run", 0, False)
    assert not (tmp_path / "out" / result.snapshot_id).exists(), "a dry run writes no marker that could block"


def test_a_pipeline_that_commits_nothing_is_a_failure_and_blocks_no_rerun(tmp_path, monkeypatch):
    """As when workers cannot reach the output or a runner never runs the finalize step."""
    digits = helpers.REPO_ROOT / "examples" / "data" / "digits"
    args = [f"--input={digits}/digits-*.tfrecord", f"--schema={digits}/schema.pbtxt", f"--output={tmp_path}", QUIET]
    with monkeypatch.context() as patched:
        patched.setattr(materialize, "_run_pipeline", lambda job, run: None)
        with pytest.raises(SnapfeedError, match=r"the pipeline finished but run run-\w+ committed nothing to "):
            materialize.run(args)
    (directory,) = [p for p in pathlib.Path(tmp_path).iterdir() if p.is_dir()]
    assert metadata.read_pending(SnapshotPaths(str(tmp_path), directory.name)).state == RunState.FAILED
    rerun = materialize.run(args)
    assert (rerun.state, rerun.rows) == ("written", 1797)
