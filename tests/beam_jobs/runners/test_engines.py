"""The materialize job on engines whose workers are other processes: the snapshot the DirectRunner writes.

- Beam's PortableRunner (``--job_endpoint=embed``) with an EXTERNAL worker pool
  (``worker_pool_main``) on 127.0.0.1, as Flink, Spark and Kubernetes run
  Python workers; the pool's SDK worker processes run the venv's python and
  import the user's preprocessing module through their own PYTHONPATH only.
  The embedded job service asks the pool for one worker per job whatever
  ``--direct_num_workers`` or ``--sdk_worker_parallelism`` say (Beam 2.77's
  ``FnApiRunner.run_via_runner_api`` never reads them); Flink and Spark ask
  for one per task slot.
- ``--runner=DaskRunner`` on a ``dask.distributed`` LocalCluster of two worker
  processes on 127.0.0.1.

Each format (TFRecord, CSV cut into several byte ranges, Parquet of several
row groups) must give the DirectRunner's snapshot: same id, same rows, and
every shard verifies.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_jobs import materialize
from beam_jobs.inputs import plan as input_plan
from reader.core.snapshot import open_snapshot, verify_shards
from schemas import command, metadata, paths
from schemas.paths import SnapshotPaths
from testing import engines
from tests import helpers

DIGITS = helpers.REPO_ROOT / "examples" / "data" / "digits"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, list[str]]:
    """The same kind of table in each format: several files, CSV columns whose type only all files decide."""
    directory = tmp_path_factory.mktemp("engine_inputs")
    rows = [{"id": i, "label": i % 10, "value": i / 4 if i % 3 else i // 4} for i in range(3000)]
    for part in range(3):
        chunk = rows[part * 1000 : (part + 1) * 1000]
        with open(directory / f"part-{part}.csv", "w", newline="") as stream:
            writer = csv.DictWriter(stream, fieldnames=["id", "label", "value"])
            writer.writeheader()
            # part 0 has only whole values in "value", part 2 leaves some empty: the type is the union.
            for row in chunk:
                value = int(row["value"]) if part == 0 else ("" if part == 2 and row["id"] % 7 == 0 else row["value"])
                writer.writerow({**row, "value": value})
        pq.write_table(pa.Table.from_pylist(chunk), directory / f"part-{part}.parquet", row_group_size=300)
    return {
        "tfrecord": [f"--input={DIGITS}/digits-*.tfrecord", f"--schema={DIGITS}/schema.pbtxt"],
        "csv": [f"--input={directory}/part-*.csv", "--input_format=csv"],
        "parquet": [f"--input={directory}/part-*.parquet", "--input_format=parquet"],
    }


@pytest.fixture
def small_csv_pieces(monkeypatch):
    """CSV files cut into byte ranges of 8 KB, so each file is read as several pieces."""
    monkeypatch.setattr(input_plan, "DEFAULT_CSV_PIECE_BYTES", 8 << 10)


PREP_FLAGS = ["--preprocessing_fn=engine_prep:scaled", '--preprocessing_params={"scale": 2}']


def _run(root: pathlib.Path, input_flags: list[str], *runner_flags: str) -> materialize.MaterializeResult:
    return materialize.run([*input_flags, f"--output={root}", "--progress_interval_seconds=0", *runner_flags])


def _assert_same_snapshot(result, reference, root: pathlib.Path, reference_root: pathlib.Path) -> None:
    assert (result.state, result.snapshot_id) == ("written", reference.snapshot_id)
    assert result.rows == reference.rows > 0
    assert helpers.snapshot_rows(root, result.snapshot_id) == helpers.snapshot_rows(
        reference_root, reference.snapshot_id
    )
    written = metadata.read_manifest(SnapshotPaths(str(root), result.snapshot_id))
    expected = metadata.read_manifest(SnapshotPaths(str(reference_root), reference.snapshot_id))
    assert written.arrow_schema_b64 == expected.arrow_schema_b64, "column types differ from the DirectRunner's"
    reports = verify_shards(open_snapshot(result.path))
    assert reports and not [r.problem for r in reports if r.problem]


def _engine_matches_direct_runner(tmp_path, pids: pathlib.Path, input_flags, *runner_flags) -> set[int]:
    """Runs the job on the DirectRunner and on the engine; returns the pids of the engine's workers that ran
    the user's function (each leaves a file in ``pids``)."""
    flags = [*input_flags, *PREP_FLAGS]
    reference = _run(tmp_path / "direct", flags)
    for stale in pids.iterdir():
        stale.unlink()
    result = _run(tmp_path / "engine", flags, *runner_flags)
    _assert_same_snapshot(result, reference, tmp_path / "engine", tmp_path / "direct")
    workers = {int(p.name) for p in pids.iterdir()}
    assert workers and os.getpid() not in workers, "the user's function must run in the engine's worker processes"
    return workers


# --- Beam's PortableRunner with an EXTERNAL worker pool ----------------------------------------------------------


@pytest.fixture(scope="module")
def worker_pool(user_module, pids):
    """``worker_pool_main`` on a free port (``testing.engines``); its SDK workers import the user module through
    their own PYTHONPATH only."""
    with engines.worker_pool(pythonpath=(str(user_module),), env={"ENGINE_PREP_PIDS": str(pids)}) as address:
        yield address


@pytest.mark.parametrize("input_format", ["csv", "parquet", "tfrecord"])
def test_portable_runner_with_an_external_worker_pool(
    worker_pool, user_module, pids, inputs, input_format, tmp_path, small_csv_pieces, monkeypatch
):
    monkeypatch.syspath_prepend(str(user_module))  # the driver fingerprints the module; workers import it themselves
    _engine_matches_direct_runner(tmp_path, pids, inputs[input_format], *engines.portable_flags(worker_pool))


# --- Beam's DaskRunner on dask.distributed ---------------------------------------------------------------------


@pytest.mark.parametrize("input_format", ["csv", "parquet", "tfrecord"])
def test_dask_runner_on_a_distributed_cluster(
    dask_scheduler, user_module, pids, inputs, input_format, tmp_path, small_csv_pieces, monkeypatch
):
    monkeypatch.syspath_prepend(str(user_module))
    workers = _engine_matches_direct_runner(tmp_path, pids, inputs[input_format], *engines.dask_flags(dask_scheduler))
    assert len(workers) == 2, f"the input pieces ran on {workers} only: the runner must spread them over both workers"


@pytest.mark.slow
def test_a_user_error_on_the_jobs_own_dask_cluster_is_one_line(tmp_path):
    """Without --dask_client_address the runner starts a LocalCluster, whose workers wrote their own
    "Compute Failed" report (6 lines) on the job's stderr above its error line; the traceback is in the log."""
    failed = helpers.run_materialize(
        f"--input={DIGITS}/digits-*.tfrecord",
        f"--schema={DIGITS}/schema.pbtxt",
        f"--output={tmp_path}",
        "--runner=DaskRunner",
        "--preprocessing_fn=tests.prep_functions:explode",
        "--progress_interval_seconds=0",
    )
    lines = [
        line
        for line in failed.stderr.splitlines()
        if line.strip() and not any(noise in line for noise in command.NATIVE_STARTUP_NOISE)
    ]
    assert failed.returncode == 1, failed.stderr
    assert len(lines) == 1, failed.stderr
    assert lines[0].startswith("error: preprocessing_fn tests.prep_functions:explode raised ZeroDivisionError")
    log = lines[0].rsplit("(full traceback: ", 1)[1].rstrip(")")
    assert "boom in user code" in pathlib.Path(log).read_text()


# --- tf.Transform: the full pass on the engines' workers ------------------------------------------------------------

TFT_FLAGS = ["--tft_preprocessing_fn=engine_prep:tft_scaled"]


def _transform_summary(result) -> dict:
    snapshot = open_snapshot(result.path)
    return json.loads((pathlib.Path(snapshot.run_dir) / paths.TRANSFORM_SUMMARY).read_text())


@pytest.mark.slow  # 21-34 s each: a worker pool or a Dask cluster running tf.Transform
@pytest.mark.parametrize("engine", ["portable", "dask"])
def test_tf_transform_on_an_engine_gives_the_direct_runners_rows_and_analyzers(
    engine, request, user_module, inputs, tmp_path, small_csv_pieces, monkeypatch
):
    """The CSV's 3 files (one with empty values: an optional feature) over several byte ranges: the analyzers'
    combiners merge what the engine's worker processes computed, into the DirectRunner's results."""
    monkeypatch.syspath_prepend(str(user_module))
    address = request.getfixturevalue("worker_pool" if engine == "portable" else "dask_scheduler")
    runner = engines.portable_flags(address) if engine == "portable" else engines.dask_flags(address)
    flags = [*inputs["csv"][:1], "--input_format=csv", *TFT_FLAGS]
    reference = _run(tmp_path / "direct", flags)
    result = _run(tmp_path / "engine", flags, *runner)
    _assert_same_snapshot(result, reference, tmp_path / "engine", tmp_path / "direct")
    assert _transform_summary(result) == _transform_summary(reference)
    assert len(open_snapshot(result.path).metadata.transform_files) > 4
