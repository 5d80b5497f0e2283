"""The job's plan: everything the driver decides before it writes anything (docs/architecture.md §3.1).

``resolve`` matches the input files, reads the TFMD schema and the CSV header,
loads and checks the preprocessing function (tracing a tf.Transform one over the
raw features) and computes the fingerprint, and returns it all as one frozen
``JobPlan``. It is a module of its own because three readers share that plan
and none of them owns it: the driver (``beam_jobs.materialize``: the state
machine's decision, the run, its failure), the graph (``beam_jobs.pipeline``:
the files, columns and function it wires up) and ``--print_fingerprint`` (what
``snapfeed explain --job-flags`` reads). Planning touches no marker and no
output, so a plan can be made, printed and thrown away; the flags themselves
are parsed by the driver (``materialize.plan``), which hands this module the
frozen config.
"""

from __future__ import annotations

import dataclasses
import json

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, TestOptions
from google.protobuf import json_format

from beam_jobs.inputs import csv_types
from beam_jobs.inputs.sources import csv_header, match_input_files, read_schema
from beam_jobs.options import MaterializeConfig
from beam_jobs.preprocessing import raw_features, tf_transform, tft_window
from beam_jobs.preprocessing.batch_fn import check_params, load_function
from beam_jobs.writing import commit
from schemas.errors import UsageError
from schemas.fingerprint import build_components, fingerprint
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import FingerprintComponents


@dataclasses.dataclass(frozen=True)
class Inputs:
    """Everything resolved from the inputs before any pipeline runs."""

    files: list
    schema: object
    schema_text: str
    csv_column_names: tuple[str, ...]
    csv_skip_header_lines: int
    raw_schema: object = None  # the raw features' TFMD schema a tf.Transform function is traced over


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """The user's function, loaded and checked in the driver, and what its kind needs."""

    fn: object = None
    tf_transform: bool = False
    transform_library: str = ""  # "tensorflow-transform==X" for a tf.Transform function
    window: bool = False  # tf.Transform with --view: raw rows and an analyzer cache, the view's graph over its days


def load_preprocessing(config: MaterializeConfig, inputs: Inputs) -> tuple[Preprocessing, Inputs]:
    """Loads and checks the function: an instance-level one against its params, a tf.Transform one by tracing it
    over the raw features (whose schema is decided here)."""
    if config.tft_preprocessing_fn:
        spec = config.tft_preprocessing_fn
        library = tf_transform.transform_library()
        window = bool(config.view)
        if window:  # another snapshot than the transformed one: raw rows, an analyzer cache (tft_window)
            library = f"{library} ({tft_window.WINDOW_MODE})"
        fn = load_function(spec, tf_transform.FLAG)
        schema = raw_features.raw_schema(
            input_format=config.input_format,
            schema=inputs.schema,
            files=[f.path for f in inputs.files],
            csv_column_names=inputs.csv_column_names,
            csv_skip_header_lines=inputs.csv_skip_header_lines,
        )
        tf_transform.check_function(spec, fn, schema)
        return Preprocessing(fn, True, library, window), dataclasses.replace(inputs, raw_schema=schema)
    if not config.preprocessing_fn:
        return Preprocessing(), inputs
    fn = load_function(config.preprocessing_fn)
    if tf_transform.uses_tf_transform(fn):
        raise UsageError(
            f"--preprocessing_fn={config.preprocessing_fn} calls tensorflow_transform, whose analyzers need the "
            f"full pass over the data: pass it as {tf_transform.FLAG}"
        )
    check_params(config.preprocessing_fn, fn, config.preprocessing_params)
    return Preprocessing(fn), inputs


def resolve_inputs(config: MaterializeConfig) -> Inputs:
    """The exact file list (the fingerprint's and the pipeline's), the TFMD schema and the CSV columns."""
    files = match_input_files(config.input_patterns, config.fingerprint_inputs)
    schema, schema_text = read_schema(config.schema_path) if config.schema_path else (None, "")
    names, skip = config.csv_column_names, 0
    if config.input_format == "csv" and not names:
        names, skip = tuple(csv_header(files[0].path)), 1
    return Inputs(files, schema, schema_text, names, skip)


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """Everything decided before anything is written: options, inputs and the fingerprint."""

    options: PipelineOptions
    config: MaterializeConfig
    inputs: Inputs
    components: FingerprintComponents
    fingerprint: str
    snapshot: SnapshotPaths
    started: float  # time.monotonic() when planning began: the summary's seconds include it
    preprocessing: Preprocessing = Preprocessing()

    def tft_temp_dir(self, run: commit.RunSpec) -> str:
        """Where tf.Transform writes its intermediate files for ``run`` (removed when the run ends).

        tf.Transform writes the traced function there while the pipeline is built, so a dry run, which must open
        no connection, gives it a local directory instead of ``--temp_location``.
        """
        dry_run = self.options.view_as(TestOptions).dry_run
        temp_location = None if dry_run else self.options.view_as(GoogleCloudOptions).temp_location
        return tf_transform.temp_dir_for(run, temp_location)

    def fingerprint_json(self) -> str:
        """What ``--print_fingerprint`` prints (and ``snapfeed explain --job-flags`` reads)."""
        components = json_format.MessageToDict(self.components, preserving_proto_field_name=True)
        return json.dumps(
            {
                "snapshot_id": self.snapshot.snapshot_id,
                "fingerprint": self.fingerprint,
                "fingerprint_components": components,
            },
            sort_keys=True,
        )


def resolve(options: PipelineOptions, config: MaterializeConfig, *, started: float) -> JobPlan:
    """Matches the inputs, loads the function and computes the fingerprint of the job ``config`` describes.

    Reads the inputs (file list, schema, CSV header, for tf.Transform a sample of
    lines) and writes nothing. ``options`` must already be set on Beam's
    FileSystems (the driver does so), since matching an ``s3://`` pattern needs them.
    """
    inputs = resolve_inputs(config)
    preprocessing, inputs = load_preprocessing(config, inputs)
    parsed_csv = csv_types.applies(config.input_format, inputs.schema, preprocessing.tf_transform)
    components = build_components(
        input_format=csv_types.FINGERPRINT_FORMAT if parsed_csv else config.input_format,
        input_patterns=list(config.input_patterns),
        fingerprint_inputs=config.fingerprint_inputs,
        input_files=inputs.files,
        schema_text=inputs.schema_text,
        csv_column_names=list(inputs.csv_column_names),
        preprocessing_fn=preprocessing.fn,
        preprocessing_params=config.preprocessing_params,
        transform_library=preprocessing.transform_library,
    )
    snapshot_fingerprint = fingerprint(components)
    snapshot = SnapshotPaths(config.output, config.snapshot_name or snapshot_fingerprint)
    return JobPlan(options, config, inputs, components, snapshot_fingerprint, snapshot, started, preprocessing)
