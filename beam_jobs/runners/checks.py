"""Refuses, before anything is read or written, runner flags that cannot work together.

Beam accepts combinations that fail minutes later or never: Dataflow workers
or Docker containers cannot open the driver's local paths (the job would read
nothing or commit nowhere), and FlinkRunner/SparkRunner without a job server
download its jar from Maven first, retrying for minutes where the network is
slow or absent. Each check turns such a combination into a ``UsageError``
naming the flag and what to do instead (docs/engines-and-stores.md "Running on other engines").
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil

from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    GoogleCloudOptions,
    JobServerOptions,
    PipelineOptions,
    PortableOptions,
    SetupOptions,
    SparkRunnerOptions,
    StandardOptions,
    TestOptions,
)

from beam_jobs.options import MaterializeConfig
from beam_jobs.runners import worker_packages
from schemas import paths
from schemas.errors import UsageError

#: FlinkRunner's and SparkRunner's own rules for starting a local cluster with LOOPBACK workers.
_FLINK_LOCAL_MASTERS = ("[local]", "[auto]")
_SPARK_LOCAL_MASTER = re.compile(r"^local(\[.+\])?$")
_GUIDE = 'docs/engines-and-stores.md "Running on other engines"'


def runner_name(options: PipelineOptions) -> str:
    """``dataflow`` for ``DataflowRunner``, ``apache_beam...DataflowRunner`` or ``dataflow``."""
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1].lower().removesuffix("runner") or "direct"


def _environment_type(name: str, options: PipelineOptions) -> str:
    """The SDK environment a portable runner will use: the flag, else that runner's default."""
    given = options.view_as(PortableOptions).environment_type
    if given:
        return given.lower()
    if name == "flink" and options.view_as(FlinkRunnerOptions).flink_master in _FLINK_LOCAL_MASTERS:
        return "loopback"
    if name == "spark" and _SPARK_LOCAL_MASTER.match(options.view_as(SparkRunnerOptions).spark_master_url or ""):
        return "loopback"
    return "docker"


def _is_loopback_host(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def remote_workers(options: PipelineOptions) -> str | None:
    """Who runs the workers when they cannot see this machine's files (a phrase for messages), else None.

    Dataflow workers never can, nor can Docker containers (the default SDK
    environment of a portable runner that is not starting a local cluster), nor
    a worker pool on another host. DirectRunner, Dask, LOOPBACK and PROCESS
    workers are trusted to share the driver's filesystem (a Dask cluster usually
    mounts a shared one).
    """
    name = runner_name(options)
    if name == "dataflow":
        return "Dataflow workers"
    if name not in ("portable", "flink", "spark"):
        return None
    kind = _environment_type(name, options)
    if "docker" in kind:
        return f"the {name.capitalize()}Runner's Docker worker containers"
    config = options.view_as(PortableOptions).environment_config or ""
    if "external" in kind and not _is_loopback_host(config):
        return f"the worker pool at {config}"
    return None


def check_paths_reach_workers(options: PipelineOptions, config: MaterializeConfig) -> None:
    """Local --output, --temp_location or --input are refused when the workers run elsewhere.

    A dry run translates without starting workers, so it may read local inputs:
    that is what lets a pipeline be translated on a machine with no network.
    """
    where = remote_workers(options)
    if where is None:
        return
    temp = options.view_as(GoogleCloudOptions).temp_location
    if runner_name(options) == "dataflow" and not temp:
        raise UsageError("--runner=DataflowRunner needs --temp_location=gs://BUCKET/tmp (where Dataflow stages files)")
    named = [("--output", config.output), ("--temp_location", temp or "")]
    if not options.view_as(TestOptions).dry_run:
        named += [("--input", pattern) for pattern in config.input_patterns]
    for flag, path in named:
        if path and not paths.scheme(path):
            raise UsageError(
                f"{flag}={path} is a local path, but {where} cannot reach this machine's disk: use a gs:// path "
                f"(copy local files there first: gcloud storage cp -r DIR gs://BUCKET/DIR)"
            )


def check_dry_run(options: PipelineOptions) -> None:
    """--dry_run=True is honoured by DataflowRunner only; on any other runner the job would really run."""
    if options.view_as(TestOptions).dry_run and runner_name(options) != "dataflow":
        raise UsageError(
            f"--dry_run=True translates without running only on --runner=DataflowRunner; "
            f"--runner={options.view_as(StandardOptions).runner or 'DirectRunner'} would run the job: drop --dry_run"
        )


def _default_job_server_jar(name: str, options: PipelineOptions) -> str:
    """The Maven URL Beam would download the job server jar from."""
    if name == "flink":
        from apache_beam.runners.portability.flink_runner import FlinkJarJobServer

        return FlinkJarJobServer(options).path_to_jar()
    from apache_beam.runners.portability.spark_runner import SparkJarJobServer

    return SparkJarJobServer(options).path_to_jar()


def cached_jar_path(url: str, options: PipelineOptions) -> str:
    """Where Beam looks for a downloaded jar before downloading it (``--jar_cache_dir``)."""
    from apache_beam.utils.subprocess_server import JavaJarServer

    cache = options.view_as(JobServerOptions).jar_cache_dir or JavaJarServer.JAR_CACHE
    return os.path.join(cache, os.path.basename(url))


def check_job_server(options: PipelineOptions) -> None:
    """FlinkRunner/SparkRunner need a job server: --job_endpoint, or a jar on disk and java to start it."""
    name = runner_name(options)
    if name not in ("flink", "spark") or options.view_as(PortableOptions).job_endpoint:
        return
    runner = options.view_as(StandardOptions).runner
    jar_flag = f"--{name}_job_server_jar"
    jar = getattr(options.view_as(FlinkRunnerOptions if name == "flink" else SparkRunnerOptions), jar_flag[2:])
    if jar and not os.path.exists(jar) and not paths.scheme(jar):
        raise UsageError(f"{jar_flag}={jar} does not exist: give the path of the downloaded job server jar")
    if not jar:
        url = _default_job_server_jar(name, options)
        cached = cached_jar_path(url, options)
        if not os.path.exists(cached):
            raise UsageError(
                f"--runner={runner} needs a job server: pass --job_endpoint=HOST:PORT of a running one, or "
                f"{jar_flag}=PATH to the jar downloaded from {url} (or put it at {cached}); "
                f"without either Beam downloads it from Maven at run time"
            )
    if shutil.which("java") is None:
        raise UsageError(f"--runner={runner} starts its job server jar with java, which is not on PATH: install a JRE")


def check_module_reaches_workers(options: PipelineOptions, config: MaterializeConfig) -> None:
    """Remote workers import --preprocessing_fn's module from a staged package or the worker image.

    A package named by --extra_package or --setup_file must contain the module;
    an image (--sdk_container_image, a DOCKER --environment_config) or a
    --requirements_file cannot be looked into here and is trusted.
    """
    where = remote_workers(options)
    if where is None or not config.preprocessing_fn:
        return
    if worker_packages.worker_image(options) or options.view_as(SetupOptions).requirements_file:
        return
    module = config.preprocessing_fn.partition(":")[0]
    if worker_packages.shipped(options, module):
        return
    raise UsageError(
        f"--preprocessing_fn={config.preprocessing_fn}: module {module!r} would not reach {where}: package it "
        f"(a setup.py beside it) and pass --extra_package=dist/PACKAGE.tar.gz or --setup_file=PATH/setup.py, "
        f"or install it in --sdk_container_image ({_GUIDE})"
    )


#: Where TensorFlow's own file system (which tf.Transform writes its temp files with) can write, beside local disk.
_TENSORFLOW_WRITABLE = ("gs", "hdfs")


def check_transform_temp_reaches_workers(options: PipelineOptions, config: MaterializeConfig) -> None:
    """tf.Transform writes the traced function and its analyzers' results under its temp dir, and remote workers
    read them there: with remote workers that is --temp_location, on storage TensorFlow can write (not s3://)."""
    where = remote_workers(options)
    if where is None or not config.tft_preprocessing_fn:
        return
    temp = options.view_as(GoogleCloudOptions).temp_location or ""
    if paths.scheme(temp) not in _TENSORFLOW_WRITABLE:
        raise UsageError(
            f"--tft_preprocessing_fn with {where} needs --temp_location on storage they share and TensorFlow "
            f"writes (gs://BUCKET/tmp): tf.Transform keeps its intermediate files there"
            + (f"; --temp_location={temp} is not" if temp else "")
        )


def check(options: PipelineOptions, config: MaterializeConfig) -> None:
    """Every check above, in the order a user would fix them."""
    check_dry_run(options)
    check_job_server(options)
    check_paths_reach_workers(options, config)
    check_module_reaches_workers(options, config)
    check_transform_temp_reaches_workers(options, config)
