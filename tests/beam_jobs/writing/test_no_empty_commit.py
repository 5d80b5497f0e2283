"""Every run commits a readable, non-empty snapshot or fails naming why: real pipelines, real files."""

from __future__ import annotations

import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import reader
from beam_jobs import materialize
from schemas import metadata
from schemas.errors import EmptySnapshotError, UsageError
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import RunState
from tests import helpers


def _empty_input(directory: pathlib.Path, kind: str) -> list[str]:
    """Flags for an input file that holds no rows."""
    if kind == "zero-byte parquet":
        (directory / "empty.parquet").write_bytes(b"")
        return [f"--input={directory / 'empty.parquet'}", "--input_format=parquet"]
    if kind == "zero-byte tfrecord":
        (directory / "empty.tfrecord").write_bytes(b"")
        return [f"--input={directory / 'empty.tfrecord'}", "--input_format=tfrecord"]
    if kind == "rowless parquet":
        pq.write_table(pa.table({"id": pa.array([], pa.int64())}), directory / "rowless.parquet")
        return [f"--input={directory / 'rowless.parquet'}", "--input_format=parquet"]
    (directory / "header.csv").write_text("id,label\n")
    return [f"--input={directory / 'header.csv'}", "--input_format=csv"]


def _failed_marker(root: pathlib.Path) -> None:
    """Nothing committed, and the run marked failed so a rerun need not wait."""
    (directory,) = [p for p in root.iterdir() if p.is_dir()]
    snapshot = SnapshotPaths(str(root), directory.name)
    assert metadata.read_manifest(snapshot) is None
    assert metadata.read_pending(snapshot).state == RunState.FAILED


@pytest.mark.parametrize("kind", ["zero-byte parquet", "zero-byte tfrecord", "rowless parquet", "header-only csv"])
def test_inputs_without_rows_fail_naming_the_file(tmp_path, kind):
    flags = _empty_input(tmp_path, kind)
    with pytest.raises(EmptySnapshotError, match=r"the input files hold no rows: .*/(empty|rowless|header)\."):
        materialize.run([*flags, f"--output={tmp_path / 'out'}", "--progress_interval_seconds=0"])
    _failed_marker(tmp_path / "out")


def test_allow_empty_commits_zero_rows_that_every_reader_reads(tmp_path):
    flags = _empty_input(tmp_path, "header-only csv")
    result = materialize.run([*flags, f"--output={tmp_path / 'out'}", "--progress_interval_seconds=0", "--allow_empty"])
    assert (result.state, result.rows, result.shards) == ("written", 0, 0)
    snapshot = reader.open_snapshot(result.path)
    assert snapshot.metadata.num_rows == 0 and snapshot.element_spec == {}
    for output in ("numpy", "torch", "jax", "tf"):
        assert list(reader.distributed_dataset(snapshot, 4, num_replicas=2, output=output)) == [], output
    with pytest.raises(UsageError, match="has no columns .* tf.data cannot yield elements without tensors"):
        _ = reader.distributed_dataset(snapshot, 4, output="tf").tf_dataset


@pytest.mark.parametrize("function", ["returns_nothing", "drops_every_row"])
def test_a_function_that_keeps_no_row_fails_naming_it(tfrecord_input, tmp_path, function):
    args = [
        f"--input={tfrecord_input['pattern']}",
        f"--schema={tfrecord_input['schema']}",
        f"--output={tmp_path / 'out'}",
        f"--preprocessing_fn=tests.prep_functions:{function}",
        "--progress_interval_seconds=0",
    ]
    with pytest.raises(
        EmptySnapshotError, match=f"preprocessing_fn tests.prep_functions:{function} kept none of the 3000 rows read"
    ):
        materialize.run(args)
    _failed_marker(tmp_path / "out")


@pytest.mark.parametrize(
    "runner",
    [
        "apache_beam.runners.dask.dask_runner.DaskRunner",  # Beam's own: drops what finish_bundle emits
        "DaskRunner",  # the job's: beam_jobs/runners/dask_runner.py keeps it
    ],
)
def test_a_runner_that_loses_the_shard_writers_output_never_commits_less(tmp_path, dask_scheduler, runner):
    """Beam's DaskRunner (2.77) drops what a DoFn emits in finish_bundle, where the shard writer reports
    the last shard of each bundle: the job used to commit an empty snapshot of the digits data and exit 0.

    Whatever the runner does, the job commits every row read or fails saying rows were lost; the
    job's own ``--runner=DaskRunner`` commits all 1797.
    """
    digits = helpers.REPO_ROOT / "examples" / "data" / "digits"
    root = tmp_path / "out"
    job = helpers.run_materialize(
        f"--input={digits}/digits-*.tfrecord",
        f"--schema={digits}/schema.pbtxt",
        f"--output={root}",
        f"--runner={runner}",
        f"--dask_client_address={dask_scheduler}",
    )
    (directory,) = [p for p in root.iterdir() if p.is_dir()]
    manifest = metadata.read_manifest(SnapshotPaths(str(root), directory.name))
    if job.returncode == 0 or runner == "DaskRunner":
        assert job.returncode == 0, job.stderr[-3000:]
        assert manifest is not None and manifest.num_rows == 1797, job.stdout
    else:
        assert manifest is None
        last = job.stderr.strip().splitlines()[-1]
        assert last.startswith("error: 1797 rows reached the shard writers of run run-"), job.stderr
        assert "but the runner reported" in last and "closed shards" in last
        _failed_marker(root)
