"""The materialize job end to end: real pipelines, real files, read back with schemas/."""

import os
import pathlib

import pytest

from beam_jobs import materialize
from schemas import metadata
from schemas.errors import InputDataError, PreprocessingError, SchemaMismatchError, StorageError, UsageError
from schemas.paths import SnapshotPaths
from tests import helpers


def job_args(tfrecord_input, output, *extra):
    return [
        f"--input={tfrecord_input['pattern']}",
        f"--schema={tfrecord_input['schema']}",
        f"--output={output}",
        "--progress_interval_seconds=0",
        *extra,
    ]


NORMALIZE = ["--preprocessing_fn=tests.prep_functions:normalize", '--preprocessing_params={"scale": 2}']
SMALL_SHARDS = ["--block_size_bytes=8192", "--shard_size_bytes=40000"]

RUNNERS = {
    "direct-multi-threading": ["--direct_running_mode=multi_threading", "--direct_num_workers=2"],
    "direct-multi-processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    "portable-loopback": ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"],
}


@pytest.fixture(scope="module")
def reference(tfrecord_input, tmp_path_factory):
    """The default DirectRunner's snapshot (in_memory): what every other runner must equal."""
    output = tmp_path_factory.mktemp("reference")
    result = materialize.run(job_args(tfrecord_input, output, *NORMALIZE, *SMALL_SHARDS))
    return result, helpers.snapshot_rows(output, result.snapshot_id)


def test_written_snapshot_has_the_contract_layout(reference, tfrecord_input):
    result, rows = reference
    assert result.state == "written" and result.rows == 3000 and sum(rows.values()) == 3000
    assert result.shards > 1, "small shard size must give several shards"
    snapshot = SnapshotPaths(str(pathlib.Path(result.path).parent), result.snapshot_id)
    manifest = metadata.read_manifest(snapshot)
    assert manifest.complete and manifest.run_id == result.run_id
    assert manifest.fingerprint == result.snapshot_id
    assert {c.name: list(c.shape) for c in manifest.columns} == {"id": [], "features": [4], "grid": [2, 4], "label": []}
    assert manifest.fingerprint_components.function_name == "tests.prep_functions:normalize"
    assert manifest.fingerprint_components.function_params_json == '{"scale":2}'
    assert [f.path for f in manifest.fingerprint_components.input_files] == sorted(
        str(p) for p in tfrecord_input["dir"].glob("*.tfrecord")
    )
    for shard in manifest.shards:
        assert shard.path.startswith(f"{manifest.run_id}/shard-") and shard.crc32c
        assert sum(shard.block_rows) == shard.num_rows
        assert pathlib.Path(snapshot.absolute(shard.path)).stat().st_size == shard.num_bytes
    assert sum(s.num_rows for s in manifest.shards) == manifest.num_rows == 3000
    ids = sorted(dict(key)["id"] for key in rows)
    assert len(set(ids)) == 3000


@pytest.mark.parametrize("runner", ["direct-multi-threading", "direct-multi-processing", "portable-loopback"])
def test_runners_write_identical_content(runner, reference, tfrecord_input, tmp_path, repo_on_pythonpath):
    reference_result, reference_rows = reference
    result = materialize.run(job_args(tfrecord_input, tmp_path, *NORMALIZE, *SMALL_SHARDS, *RUNNERS[runner]))
    assert result.state == "written"
    assert result.snapshot_id == reference_result.snapshot_id
    assert helpers.snapshot_rows(tmp_path, result.snapshot_id) == reference_rows


def test_the_direct_runners_default_mode_is_the_fastest_for_the_format(tfrecord_input, tmp_path):
    from apache_beam.options.pipeline_options import DirectOptions

    from beam_jobs import flags
    from beam_jobs.runners import direct_runner

    def direct(*argv, input_format="tfrecord"):
        options = flags.parse(list(argv))
        direct_runner.apply_defaults(options, list(argv), input_format)
        view = options.view_as(DirectOptions)
        return view.direct_running_mode, view.direct_num_workers

    threads = max(2, min(os.cpu_count() or 1, direct_runner.TFRECORD_THREADS_MAX))
    assert direct() == ("multi_threading", threads), "the fastest mode for TFRecord input (runners/direct_runner.py)"
    assert direct(input_format="csv") == ("in_memory", 1), "for CSV (and Parquet) in_memory is"
    assert direct(input_format="parquet") == ("in_memory", 1)
    assert direct("--direct_running_mode=multi_processing") == ("multi_processing", 1), "an explicit choice is kept"
    assert direct("--direct_num_workers=3", input_format="csv") == ("multi_threading", 3), "workers ask for threads"
    portable = ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]
    assert direct(*portable, "--direct_num_workers=3")[0] == "in_memory", "other runners untouched"
    planned = materialize.plan(job_args(tfrecord_input, tmp_path)).options.view_as(DirectOptions)
    assert planned.direct_running_mode == "multi_threading", "the job plans with it"


def test_bundle_repeat_gives_no_duplicate_or_missing_rows(reference, tfrecord_input, tmp_path):
    _, reference_rows = reference
    result = materialize.run(
        job_args(tfrecord_input, tmp_path, *NORMALIZE, *SMALL_SHARDS, "--direct_runner_bundle_repeat=1")
    )
    assert helpers.snapshot_rows(tmp_path, result.snapshot_id) == reference_rows
    manifest = metadata.read_manifest(SnapshotPaths(str(tmp_path), result.snapshot_id))
    on_disk = sorted(p.name for p in (tmp_path / result.snapshot_id / result.run_id).iterdir())
    assert on_disk == sorted(s.path.split("/")[1] for s in manifest.shards), "repeated bundles' shards must be gone"


def test_second_identical_run_reuses_without_running(tfrecord_input, tmp_path):
    first = materialize.run(job_args(tfrecord_input, tmp_path))
    snapshot_dir = tmp_path / first.snapshot_id
    before = {p: p.stat().st_mtime_ns for p in snapshot_dir.rglob("*")}
    second = materialize.run(job_args(tfrecord_input, tmp_path))
    assert second.state == "reused" and second.path == first.path and second.rows == first.rows == 3000
    assert {p: p.stat().st_mtime_ns for p in snapshot_dir.rglob("*")} == before, "a reuse must write nothing"


def test_compression_and_shard_size_keep_the_fingerprint(tfrecord_input, tmp_path):
    first = materialize.run(job_args(tfrecord_input, tmp_path, "--compression=LZ4"))
    second = materialize.run(job_args(tfrecord_input, tmp_path, "--compression=ZSTD", *SMALL_SHARDS))
    assert second.snapshot_id == first.snapshot_id
    # A reuse says which asked-for codec it did not apply, and how to get it.
    assert second.state == "reused (stored LZ4; --compression=ZSTD applies to new writes; --mode=write rewrites)"
    assert materialize.run(job_args(tfrecord_input, tmp_path, "--compression=LZ4")).state == "reused"
    assert materialize.run(job_args(tfrecord_input, tmp_path)).state == "reused", "no flag given: nothing ignored"


def test_params_change_the_fingerprint(tfrecord_input, tmp_path):
    first = materialize.run(job_args(tfrecord_input, tmp_path, *NORMALIZE))
    second = materialize.run(job_args(tfrecord_input, tmp_path, NORMALIZE[0], '--preprocessing_params={"scale": 3}'))
    assert second.snapshot_id != first.snapshot_id and second.state == "written"


def test_changed_input_file_changes_the_fingerprint(tmp_path):
    raw = tmp_path / "raw"
    helpers.write_tfrecords(raw, num_rows=50, num_files=2)
    args = [f"--input={raw}/*.tfrecord", f"--output={tmp_path / 'out'}", "--progress_interval_seconds=0"]
    first = materialize.run(args)
    helpers.write_tfrecords(raw, num_rows=51, num_files=2)  # rewrites both files
    second = materialize.run(args)
    assert second.snapshot_id != first.snapshot_id and second.state == "written" and second.rows == 51


def test_changed_function_source_changes_the_fingerprint(tmp_path, monkeypatch, repo_on_pythonpath):
    raw = tmp_path / "raw"
    helpers.write_tfrecords(raw, num_rows=20, num_files=1)
    module_dir = tmp_path / "userpkg"
    module_dir.mkdir()
    monkeypatch.syspath_prepend(str(module_dir))
    source = "def prep(batch):\n    return batch\n"
    (module_dir / "user_prep_source.py").write_text(source)
    args = [f"--input={raw}/*.tfrecord", f"--output={tmp_path / 'out'}", "--preprocessing_fn=user_prep_source:prep"]
    first = materialize.run(args)
    import importlib
    import linecache
    import sys

    (module_dir / "user_prep_source.py").write_text(source + "# a comment changes the source\n")
    linecache.clearcache()
    importlib.reload(sys.modules["user_prep_source"])
    second = materialize.run(args)
    assert second.snapshot_id != first.snapshot_id and second.state == "written"


def test_tf_function_preprocessing(tfrecord_input, tmp_path):
    result = materialize.run(job_args(tfrecord_input, tmp_path, "--preprocessing_fn=tests.prep_tf:scale"))
    manifest = metadata.read_manifest(SnapshotPaths(str(tmp_path), result.snapshot_id))
    assert {c.name: list(c.shape) for c in manifest.columns} == {"id": [], "features": [4]}
    rows = helpers.snapshot_rows(tmp_path, result.snapshot_id)
    assert sum(rows.values()) == 3000


def test_csv_input_with_header(tmp_path):
    iris = helpers.REPO_ROOT / "examples" / "data" / "iris" / "iris.csv"
    result = materialize.run([f"--input={iris}", "--input_format=csv", f"--output={tmp_path}"])
    manifest = metadata.read_manifest(SnapshotPaths(str(tmp_path), result.snapshot_id))
    assert result.rows == 150
    assert [c.name for c in manifest.columns] == [
        "sepal_length",
        "sepal_width",
        "petal_length",
        "petal_width",
        "species",
    ]
    assert {c.dtype for c in manifest.columns} == {"float64", "int64"}  # as Parquet gives (test_column_types)
    assert list(manifest.fingerprint_components.csv_column_names)[0] == "sepal_length"


def test_parquet_input(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": np.arange(500), "x": np.linspace(0, 1, 500)})
    pq.write_table(table.slice(0, 250), tmp_path / "a.parquet")
    pq.write_table(table.slice(250), tmp_path / "b.parquet")
    result = materialize.run([f"--input={tmp_path}/*.parquet", "--input_format=parquet", f"--output={tmp_path / 'o'}"])
    rows = helpers.snapshot_rows(tmp_path / "o", result.snapshot_id)
    assert result.rows == 500 and len(rows) == 500


def test_several_patterns_are_read_once_each(tmp_path):
    helpers.write_tfrecords(tmp_path / "a", num_rows=30, num_files=1)
    helpers.write_tfrecords(tmp_path / "b", num_rows=20, num_files=1, start=30)
    result = materialize.run([f"--input={tmp_path}/a/*.tfrecord,{tmp_path}/b/*.tfrecord", f"--output={tmp_path / 'o'}"])
    assert result.rows == 50


# --- bad input: a clear error and no metadata.final ---------------------------------------


def assert_nothing_committed(root: pathlib.Path):
    assert helpers.final_marker_count(root) == 0


def test_pattern_matching_nothing(tmp_path):
    with pytest.raises(InputDataError, match=r"--input pattern '.*/nothing/\*.tfrecord' matches no file"):
        materialize.run([f"--input={tmp_path}/nothing/*.tfrecord", f"--output={tmp_path / 'o'}"])
    assert not (tmp_path / "o").exists()


def test_garbled_tfrecord_names_file_and_record(tfrecord_input, tmp_path):
    raw = tmp_path / "raw"
    files = helpers.write_tfrecords(raw, num_rows=200, num_files=2)
    data = bytearray(files[1].read_bytes())
    data[500:520] = b"\xff" * 20
    files[1].write_bytes(bytes(data))
    with pytest.raises(InputDataError, match=rf"{files[1]}: record \d+ at byte \d+: .*checksum mismatch"):
        materialize.run([f"--input={raw}/*.tfrecord", f"--output={tmp_path / 'o'}"])
    assert_nothing_committed(tmp_path / "o")


def test_csv_row_with_wrong_column_count_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b,c\n1,2,3\n4,5,6\n7,8\n")
    with pytest.raises(InputDataError, match=rf"{bad}: line 4 has 2 columns, expected 3"):
        materialize.run([f"--input={bad}", "--input_format=csv", f"--output={tmp_path / 'o'}"])
    assert_nothing_committed(tmp_path / "o")


@pytest.mark.parametrize(
    "function, error, message",
    [
        (
            "explode",
            PreprocessingError,
            r"preprocessing_fn tests.prep_functions:explode raised ZeroDivisionError: boom",
        ),
        (
            "wrong_type",
            PreprocessingError,
            r"tests.prep_functions:wrong_type returned list; return a pyarrow.RecordBatch",
        ),
        (  # one worker thread's batches, or the shards of two (their order decides the direction)
            "schema_changer",
            SchemaMismatchError,
            r"schema_changer changed its output schema.*'id' (int64 -> double|double -> int64)",
        ),
    ],
)
def test_bad_preprocessing_function(function, error, message, tfrecord_input, tmp_path):
    with pytest.raises(error, match=message):
        materialize.run(job_args(tfrecord_input, tmp_path, f"--preprocessing_fn=tests.prep_functions:{function}"))
    assert_nothing_committed(tmp_path)
    (pending_file,) = tmp_path.glob("*/snapshot.metadata")
    assert '"state": "FAILED"' in pending_file.read_text(), "the failure is recorded for the next writer"


def test_unimportable_function_is_a_usage_error(tfrecord_input, tmp_path):
    with pytest.raises(UsageError, match="cannot import module 'no_such_module'"):
        materialize.run(job_args(tfrecord_input, tmp_path, "--preprocessing_fn=no_such_module:f"))


def test_unwritable_output_root(tfrecord_input, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(StorageError, match="cannot create directory .*a-file/out"):
        materialize.run(job_args(tfrecord_input, blocker / "out"))


@pytest.mark.parametrize("codec", ["GZIP", "SNAPPY"])
def test_refused_codecs_exit_2(codec, tfrecord_input, tmp_path):
    completed = helpers.run_materialize(*job_args(tfrecord_input, tmp_path, f"--compression={codec}"))
    assert completed.returncode == 2
    assert f"--compression={codec} is not supported" in completed.stderr and "ZSTD" in completed.stderr
    assert not any(tmp_path.iterdir())


def test_cli_summary_line_and_exit_codes(tfrecord_input, tmp_path):
    completed = helpers.run_materialize(*job_args(tfrecord_input, tmp_path))
    assert completed.returncode == 0, completed.stderr
    fields = helpers.summary_fields(completed.stdout)
    assert fields["state"] == "written" and fields["rows"] == "3000" and int(fields["shards"]) >= 1
    assert pathlib.Path(fields["path"]).parent == tmp_path
    again = helpers.run_materialize(*job_args(tfrecord_input, tmp_path))
    assert again.returncode == 0 and helpers.summary_fields(again.stdout)["state"] == "reused"
    missing = helpers.run_materialize(f"--input={tmp_path}/none*", f"--output={tmp_path}")
    assert missing.returncode == 1 and "matches no file" in missing.stderr
    usage = helpers.run_materialize(f"--input={tfrecord_input['pattern']}")
    assert usage.returncode == 2 and "--output is required" in usage.stderr


DIGITS = helpers.REPO_ROOT / "examples" / "data" / "digits"


@pytest.mark.parametrize("compression", ["NONE", "LZ4"])
def test_a_shard_bound_below_the_block_size_caps_the_blocks(compression, tmp_path):
    """--shard_size_bytes=20000 over the digits (1797 rows of 264 bytes) wrote one 148 KB shard: blocks are
    now cut to fit the bound, so every shard is within it (a row's bytes of slack for the blocks' padding)."""
    bound, row_bytes = 20_000, 8 * 8 * 4 + 8
    result = materialize.run(
        [
            f"--input={DIGITS}/digits-*.tfrecord",
            f"--schema={DIGITS}/schema.pbtxt",
            "--preprocessing_fn=examples.digits_prep:preprocess",
            f"--output={tmp_path}",
            f"--shard_size_bytes={bound}",
            f"--compression={compression}",
            "--progress_interval_seconds=0",
        ]
    )
    manifest = metadata.read_manifest(SnapshotPaths(str(tmp_path), result.snapshot_id))
    sizes = [shard.num_bytes for shard in manifest.shards]
    assert manifest.num_rows == 1797 and len(sizes) >= 1797 * row_bytes // bound
    assert max(sizes) <= bound + row_bytes, sizes
    assert sum(helpers.snapshot_rows(tmp_path, result.snapshot_id).values()) == 1797
