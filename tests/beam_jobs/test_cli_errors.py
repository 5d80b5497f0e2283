"""Every command ends a bad input with one short ``error:`` line naming the culprit (real processes, real files)."""

import subprocess

import pytest

from beam_jobs import flags
from schemas import command
from tests import helpers


def assert_one_clear_line(completed, code: int, prefix: str, *named: str) -> str:
    lines = [
        line
        for line in completed.stderr.splitlines()
        if line and not any(n in line for n in command.NATIVE_STARTUP_NOISE)
    ]
    assert completed.returncode == code, completed.stderr[-3000:]
    assert lines and lines[-1].startswith(f"{prefix}: "), completed.stderr[-3000:]
    assert "Traceback" not in completed.stderr and len(lines) < 25, completed.stderr[-3000:]
    for word in named:
        assert word in lines[-1], lines[-1]
    return lines[-1]


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bad")
    (directory / "table.csv").write_text("a,b\n1,2\n")
    float_label = helpers.SCHEMA_PBTXT.replace('name: "label" type: INT', 'name: "label" type: FLOAT')
    (directory / "float_label.pbtxt").write_text(float_label)
    return directory


def job(tfrecord_input, output, *extra):
    return [
        f"--input={tfrecord_input['pattern']}",
        f"--schema={tfrecord_input['schema']}",
        f"--output={output}",
        *extra,
    ]


def test_a_csv_file_given_as_parquet_is_named(bad_inputs, tmp_path):
    csv = bad_inputs / "table.csv"
    completed = helpers.run_materialize(f"--input={csv}", "--input_format=parquet", f"--output={tmp_path}")
    line = assert_one_clear_line(completed, 1, "error", str(csv), "not a Parquet file")
    log = line.rsplit("full traceback: ", 1)[1].rstrip(")")
    assert "ArrowInvalid" in open(log).read(), "the log the line names holds the traceback"


@pytest.mark.parametrize("extra", [[], ["--csv_column_names=a,b"]], ids=["header", "named-columns"])
def test_a_tfrecord_given_as_csv_is_named(extra, tfrecord_input, tmp_path):
    completed = helpers.run_materialize(
        f"--input={tfrecord_input['pattern']}", "--input_format=csv", f"--output={tmp_path}", *extra
    )
    assert_one_clear_line(completed, 1, "error", str(tfrecord_input["dir"]), "not UTF-8 text")


def test_a_successful_run_says_nothing_on_stderr(tfrecord_input, tmp_path):
    """TensorFlow's C++ start-up lines (cudart_stub, absl's InitializeLog warning) were on every run's stderr."""
    completed = helpers.run_materialize(*job(tfrecord_input, tmp_path))
    assert completed.returncode == 0 and completed.stderr == "", completed.stderr
    verbose = helpers.run_materialize(*job(tfrecord_input, tmp_path), "--verbose")
    assert verbose.returncode == 0 and "reused" in verbose.stdout


def test_a_csv_or_parquet_extension_names_the_format(bad_inputs, tmp_path):
    """Before, a .csv without --input_format was read as TFRecord and called "not valid TFRecord; regenerate it"."""
    completed = helpers.run_materialize(f"--input={bad_inputs / 'table.csv'}", f"--output={tmp_path / 'out'}")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert helpers.summary_fields(completed.stdout)["rows"] == "1"
    (tmp_path / "table.parquet").write_text("a,b\n1,2\n")
    mixed = helpers.run_materialize(f"--input={bad_inputs}/*.csv,{tmp_path}/*.parquet", f"--output={tmp_path}")
    assert_one_clear_line(mixed, 2, "usage error", "csv and parquet by their extensions", "--input_format")
    misnamed = tmp_path / "table.data"
    misnamed.write_text("a,b\n1,2\n")
    completed = helpers.run_materialize(f"--input={misnamed}", f"--output={tmp_path}")
    assert_one_clear_line(completed, 1, "error", str(misnamed), "not valid TFRecord", "--input_format=csv")


def test_a_schema_type_mismatch_names_the_feature(tfrecord_input, bad_inputs, tmp_path):
    completed = helpers.run_materialize(
        f"--input={tfrecord_input['pattern']}", f"--schema={bad_inputs / 'float_label.pbtxt'}", f"--output={tmp_path}"
    )
    line = assert_one_clear_line(completed, 1, "error", "feature 'label'", "type FLOAT", "integer values")
    assert "Regenerate" not in line


def test_system_exit_in_the_function_is_a_preprocessing_error(tfrecord_input, tmp_path):
    completed = helpers.run_materialize(*job(tfrecord_input, tmp_path, "--preprocessing_fn=tests.prep_functions:exits"))
    assert_one_clear_line(completed, 1, "error", "preprocessing_fn tests.prep_functions:exits raised SystemExit: 3")


@pytest.mark.parametrize(
    ("flag", "named"),
    [
        ("--compresion=LZ4", ("unknown flag --compresion", "did you mean --compression?")),
        ("--inptu=x", ("unknown flag --inptu", "did you mean --input?")),
        ("--shard_size_bytes=big", ("--shard_size_bytes", "invalid int value")),
        (
            "--preprocessing_fn=tests.prep_functions:keep_ids",
            ("--preprocessing_params given", "tests.prep_functions:keep_ids takes only the batch"),
        ),
    ],
)
def test_flag_mistakes_are_usage_errors(flag, named, tfrecord_input, tmp_path):
    completed = helpers.run_materialize(*job(tfrecord_input, tmp_path, flag, '--preprocessing_params={"a": 1}'))
    assert_one_clear_line(completed, 2, "usage error", *named)
    assert not any(tmp_path.iterdir()), "nothing runs on a usage error"


def test_help_lists_every_job_flag_with_its_help():
    completed = subprocess.run(
        helpers.materialize_command("--help"), env=helpers.cli_env(), capture_output=True, text=True, check=False
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    text = " ".join(completed.stdout.split())
    for action in flags.help_parser()._actions:
        assert action.help, f"{action.option_strings} has no help"
        assert all(option in text for option in action.option_strings)
    assert "Any Beam pipeline option passes through" in text


def test_the_dask_runner_short_name_is_the_full_path():
    options = flags.parse(["--runner=DaskRunner", "--dask_client_address=tcp://127.0.0.1:1"])
    assert options.view_as(flags.StandardOptions).runner == "beam_jobs.runners.dask_runner.DaskRunner"


def test_snapfeed_errors_exit_1_and_usage_errors_2(tmp_path):
    missing = helpers.run_module("reader.snapshots", "verify", str(tmp_path / "none"))
    assert_one_clear_line(missing, 1, "error", str(tmp_path / "none"))
    unknown = helpers.run_module("reader.snapshots", "lst", str(tmp_path))
    assert_one_clear_line(unknown, 2, "usage error", "invalid choice: 'lst'", "snapfeed --help")
    show = helpers.run_module("reader.snapshots", "show", str(tmp_path / "none"))
    assert_one_clear_line(show, 2, "usage error", "holds no snapshot markers")


def test_reader_service_errors_exit_1_and_usage_errors_2(tmp_path):
    unreachable = helpers.run_module("reader.service", "status", "--dispatcher=127.0.0.1:1")
    assert_one_clear_line(unreachable, 1, "error", "the dispatcher at 127.0.0.1:1 is unreachable")
    no_token = helpers.run_module(
        "reader.service", "status", "--dispatcher=127.0.0.1:1", f"--auth_token_file={tmp_path}/t"
    )
    assert_one_clear_line(no_token, 2, "usage error", f"--auth_token_file={tmp_path}/t")
    missing = helpers.run_module("reader.service", "worker")
    assert_one_clear_line(missing, 2, "usage error", "--dispatcher")
