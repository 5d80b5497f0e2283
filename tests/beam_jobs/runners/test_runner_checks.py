"""Runner flags that cannot work together are usage errors before anything runs (``beam_jobs.runners.checks``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs import flags
from beam_jobs.options import MaterializeConfig
from beam_jobs.runners import checks as runner_checks
from beam_jobs.runners import worker_packages
from schemas.errors import UsageError
from tests import helpers
from tests.beam_jobs.test_cli_errors import assert_one_clear_line

DATAFLOW = ["--runner=DataflowRunner", "--project=p", "--region=us-central1"]


def config(output="gs://b/out", inputs=("gs://b/raw/*.parquet",), fn=None) -> MaterializeConfig:
    return MaterializeConfig(input_patterns=inputs, input_format="parquet", output=output, preprocessing_fn=fn)


def sdist_of(directory, module_file: str) -> str:
    """A real sdist of a one-module package, built the way a user would."""
    (directory / module_file).parent.mkdir(parents=True, exist_ok=True)
    (directory / module_file).write_text("def preprocess(batch):\n    return batch\n")
    top = module_file.split("/", 1)[0].removesuffix(".py")
    kind = "packages" if "/" in module_file else "py_modules"
    (directory / "setup.py").write_text(
        f"from setuptools import setup\nsetup(name='{top}', version='0.1', {kind}=['{top}'])\n"
    )
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", "dist"], cwd=directory, check=True)
    (archive,) = (directory / "dist").glob("*.tar.gz")
    return str(archive)


@pytest.mark.parametrize(
    ("argv", "remote"),
    [
        (DATAFLOW, "Dataflow workers"),
        (["--runner=apache_beam.runners.dataflow.dataflow_runner.DataflowRunner"], "Dataflow workers"),
        (["--runner=FlinkRunner"], None),  # [auto] master: a local cluster with LOOPBACK workers
        (["--runner=FlinkRunner", "--flink_master=flink:8081"], "the FlinkRunner's Docker worker containers"),
        (["--runner=SparkRunner"], None),
        (["--runner=SparkRunner", "--spark_master_url=spark://h:7077"], "the SparkRunner's Docker worker containers"),
        (["--runner=PortableRunner", "--environment_type=EXTERNAL", "--environment_config=127.0.0.1:5"], None),
        (["--runner=PortableRunner", "--environment_type=EXTERNAL", "--environment_config=localhost:5"], None),
        (
            ["--runner=PortableRunner", "--environment_type=EXTERNAL", "--environment_config=10.0.0.7:5"],
            "the worker pool at 10.0.0.7:5",
        ),
        (["--runner=PortableRunner", "--environment_type=LOOPBACK"], None),
        (["--runner=DaskRunner", "--dask_client_address=tcp://10.0.0.7:8786"], None),
        ([], None),
    ],
)
def test_which_workers_are_remote(argv, remote):
    assert runner_checks.remote_workers(flags.parse(argv)) == remote


@pytest.mark.parametrize(
    ("argv", "job", "flag"),
    [
        ([*DATAFLOW, "--temp_location=gs://b/tmp"], config(output="/saved/data"), "--output=/saved/data"),
        ([*DATAFLOW, "--temp_location=/tmp/t"], config(), "--temp_location=/tmp/t"),
        ([*DATAFLOW, "--temp_location=gs://b/tmp"], config(inputs=("/raw/*.parquet",)), "--input=/raw/*.parquet"),
        (["--runner=FlinkRunner", "--flink_master=flink:8081"], config(output="/saved/data"), "--output=/saved/data"),
    ],
)
def test_remote_workers_refuse_local_paths_naming_the_flag(argv, job, flag):
    with pytest.raises(UsageError, match="is a local path, but .* cannot reach this machine's disk: use a gs://") as e:
        runner_checks.check_paths_reach_workers(PipelineOptions(argv), job)
    assert str(e.value).startswith(flag)


def test_dataflow_needs_a_temp_location_and_a_dry_run_may_read_local_inputs():
    with pytest.raises(UsageError, match="needs --temp_location=gs://BUCKET/tmp"):
        runner_checks.check_paths_reach_workers(PipelineOptions(DATAFLOW), config())
    dry = PipelineOptions([*DATAFLOW, "--temp_location=gs://b/tmp", "--dry_run=True"])
    runner_checks.check_paths_reach_workers(dry, config(inputs=("/raw/*.parquet",)))
    with pytest.raises(UsageError, match="^--output=/o is a local path"):
        runner_checks.check_paths_reach_workers(dry, config(output="/o"))


def test_local_workers_keep_local_paths():
    for argv in ([], ["--runner=FlinkRunner"], ["--runner=PortableRunner", "--environment_type=LOOPBACK"]):
        runner_checks.check_paths_reach_workers(PipelineOptions(argv), config(output="/o", inputs=("/raw/x",)))


def test_a_dry_run_anywhere_but_dataflow_is_refused():
    with pytest.raises(UsageError, match=r"--dry_run=True .* only on --runner=DataflowRunner; --runner=DirectRunner"):
        runner_checks.check_dry_run(PipelineOptions(["--dry_run=True"]))
    runner_checks.check_dry_run(PipelineOptions([*DATAFLOW, "--dry_run=True"]))


@pytest.mark.parametrize("runner", ["FlinkRunner", "SparkRunner"])
def test_flink_and_spark_without_a_job_server_say_what_is_needed(runner, tmp_path):
    name = runner.removesuffix("Runner").lower()
    options = PipelineOptions([f"--runner={runner}", f"--jar_cache_dir={tmp_path}"])
    with pytest.raises(UsageError) as e:
        runner_checks.check_job_server(options)
    message = str(e.value)
    assert f"--runner={runner} needs a job server: pass --job_endpoint=HOST:PORT" in message
    assert f"--{name}_job_server_jar=PATH" in message and "https://repo.maven.apache.org/" in message
    runner_checks.check_job_server(PipelineOptions([f"--runner={runner}", "--job_endpoint=localhost:8099"]))
    with pytest.raises(UsageError, match=f"--{name}_job_server_jar={tmp_path}/none.jar does not exist"):
        runner_checks.check_job_server(
            PipelineOptions([f"--runner={runner}", f"--{name}_job_server_jar={tmp_path}/none.jar"])
        )


@pytest.mark.skipif(shutil.which("java") is None, reason="a job server jar needs java")
def test_a_jar_in_beams_cache_is_enough(tmp_path):
    options = PipelineOptions(["--runner=FlinkRunner", f"--jar_cache_dir={tmp_path}"])
    url = runner_checks._default_job_server_jar("flink", options)
    (tmp_path / url.rsplit("/", 1)[1]).write_bytes(b"PK")
    runner_checks.check_job_server(options)


def test_the_preprocessing_module_must_travel_to_remote_workers(tmp_path):
    job = config(fn="my_prep:preprocess")
    base = [*DATAFLOW, "--temp_location=gs://b/tmp"]
    with pytest.raises(UsageError, match="module 'my_prep' would not reach Dataflow workers: package it"):
        runner_checks.check_module_reaches_workers(PipelineOptions(base), job)
    package = sdist_of(tmp_path / "pkg", "my_prep/__init__.py")
    runner_checks.check_module_reaches_workers(PipelineOptions([*base, f"--extra_package={package}"]), job)
    runner_checks.check_module_reaches_workers(PipelineOptions([*base, f"--setup_file={tmp_path}/pkg/setup.py"]), job)
    runner_checks.check_module_reaches_workers(PipelineOptions([*base, "--sdk_container_image=r/w:1"]), job)
    other = sdist_of(tmp_path / "other", "other_prep.py")
    with pytest.raises(UsageError, match="module 'my_prep' would not reach"):
        runner_checks.check_module_reaches_workers(PipelineOptions([*base, f"--extra_package={other}"]), job)


def test_wheels_are_looked_into_too(tmp_path):
    wheel = tmp_path / "my_prep-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as bundle:
        bundle.writestr("my_prep.py", "")
    assert worker_packages.archive_has_module(str(wheel), "my_prep.sub")
    assert not worker_packages.archive_has_module(str(wheel), "my")


@pytest.mark.parametrize("runner", ["FlinkRunner", "SparkRunner"])
def test_the_command_refuses_flink_and_spark_without_a_job_server_before_writing(runner, tfrecord_input, tmp_path):
    """Beam would download the job server jar from Maven (minutes of retries on a slow network)."""
    completed = helpers.run_materialize(
        f"--input={tfrecord_input['pattern']}",
        f"--schema={tfrecord_input['schema']}",
        f"--output={tmp_path / 'out'}",
        f"--runner={runner}",
        f"--jar_cache_dir={tmp_path / 'jars'}",
    )
    assert_one_clear_line(completed, 2, "usage error", f"--runner={runner} needs a job server", "--job_endpoint")
    assert not (tmp_path / "out").exists()


def test_tf_transform_with_remote_workers_needs_a_temp_location_tensorflow_writes():
    tft = MaterializeConfig(
        input_patterns=("gs://b/raw/*.csv",), input_format="csv", output="gs://b/out", tft_preprocessing_fn="m:f"
    )
    pool = ["--runner=PortableRunner", "--environment_type=EXTERNAL", "--environment_config=10.0.0.7:5"]
    with pytest.raises(UsageError, match="^--tft_preprocessing_fn with the worker pool at 10.0.0.7:5 needs --temp_loc"):
        runner_checks.check_transform_temp_reaches_workers(PipelineOptions(pool), tft)
    with pytest.raises(UsageError, match="; --temp_location=s3://b/tmp is not"):
        runner_checks.check_transform_temp_reaches_workers(PipelineOptions([*pool, "--temp_location=s3://b/tmp"]), tft)
    runner_checks.check_transform_temp_reaches_workers(PipelineOptions([*pool, "--temp_location=gs://b/tmp"]), tft)
    runner_checks.check_transform_temp_reaches_workers(PipelineOptions([]), tft)  # local workers: a local temp dir
    runner_checks.check_transform_temp_reaches_workers(PipelineOptions(pool), config())  # no tf.Transform function
