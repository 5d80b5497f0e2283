"""Full-pass preprocessing with tf.Transform (``--tft_preprocessing_fn``): Analyze, Transform, and the graph.

The Distributed Input guide's "Data preprocessing" (seed 003): an Analyze phase,
a full pass over the raw data computing statistics (means and variances,
min/max, vocabularies, quantile boundaries), then a Transform phase applying
them row by row, and the transform graph that serving applies to raw inputs, so
training and serving never skew. ``AnalyzeAndTransform`` runs tft_beam's
``AnalyzeAndTransformDataset`` over the job's raw batches (read by the same
inputs as the instance-level path, in TFXIO's form: ``raw_features``), turns
the transformed batches into the snapshot's dense columns and publishes the
graph into the run (``transform_graph``), for ``WriteSnapshot`` to commit with
the shards.

The function is traced in the driver, where tf.Transform builds its graph, and
its mistakes are refused there in one line before anything is written
(``check_function``): a function over RecordBatches, a feature the inputs lack,
an analyzer over a type it does not take. Workers run the graph, not the
function, so they need tensorflow-transform but not the user's module.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import apache_beam as beam
import pyarrow as pa
from google.protobuf import text_format

from beam_jobs.inputs.sources import densify, fixed_shapes
from beam_jobs.preprocessing import raw_features, transform_graph
from beam_jobs.writing.commit import RunSpec
from schemas.errors import PreprocessingError, StorageError, UsageError
from schemas.tft_import import import_tft

FLAG = "--tft_preprocessing_fn"


def transform_library() -> str:
    """``"tensorflow-transform==X"``, the fingerprint's record of whose analyzers ran; one line if it is missing."""
    return f"tensorflow-transform=={import_tft(FLAG).__version__}"


def uses_tf_transform(fn: Callable) -> bool:
    """Whether ``fn``'s code names the tensorflow_transform module (``tft.scale_to_z_score``, ...): such a
    function needs the full pass and is refused as an instance-level ``--preprocessing_fn``."""
    target = getattr(fn, "python_function", fn)
    code, names = getattr(target, "__code__", None), getattr(target, "__globals__", {})
    if code is None:
        return False
    for name in code.co_names:
        module = getattr(names.get(name), "__name__", "")
        if isinstance(module, str) and module.split(".")[0] == "tensorflow_transform":
            return True
    return False


def _type_specs(schema) -> dict:
    """The raw features as the function sees them: a ``tf.TypeSpec`` (dense, sparse or ragged) per name."""
    import_tft(FLAG)  # the first import goes through the guard, whoever calls first
    from tensorflow_transform import impl_helper
    from tensorflow_transform.tf_metadata import schema_utils

    return impl_helper.get_type_specs_from_feature_specs(schema_utils.schema_as_feature_spec(schema).feature_spec)


def check_function(spec: str, fn: Callable, schema) -> None:
    """Traces ``fn`` over the raw features of ``schema``, as tf.Transform will; its mistakes as one line."""
    import tensorflow as tf

    tft = import_tft(FLAG)

    type_specs = _type_specs(schema)
    names = sorted(type_specs)

    def traced(inputs):
        outputs = fn(inputs)
        if not isinstance(outputs, dict) or not outputs:
            raise PreprocessingError(
                f"{FLAG}={spec} returned {type(outputs).__name__}; a tf.Transform preprocessing_fn returns a dict "
                f"of feature name -> Tensor, SparseTensor or RaggedTensor"
            )
        return outputs

    try:
        tft.get_analyze_input_columns(traced, type_specs)
    except PreprocessingError:
        raise
    except KeyError as exc:
        missing = exc.args[0] if exc.args else exc
        raise UsageError(
            f"{FLAG}={spec} reads feature {missing!r}, which the raw inputs lack (they have {names}); fix the "
            f"function or the inputs (--schema, the CSV header)"
        ) from exc
    except AttributeError as exc:
        raise UsageError(
            f"{FLAG}={spec} is not a tf.Transform preprocessing_fn: given a dict of tensors it raised "
            f"AttributeError: {exc}. A function over pyarrow RecordBatches (or dicts of NumPy arrays) is an "
            f"instance-level one: pass it as --preprocessing_fn"
        ) from exc
    except (TypeError, ValueError, tf.errors.OpError) as exc:
        detail = " ".join(str(exc).split())[:500]
        raise UsageError(
            f"{FLAG}={spec} failed while tf.Transform traced it over the raw features {names} "
            f"({type(exc).__name__}: {detail}); fix the function (an analyzer over a type it does not take, e.g. "
            f"a vocabulary over a float feature, is refused here: cast or bucketize the feature first)"
        ) from exc


def _dense_batch(element: tuple[pa.RecordBatch, dict], shapes: dict[str, tuple[int, ...]]) -> pa.RecordBatch:
    """A transformed batch (TFXIO's list columns) as the snapshot stores it: fixed-shape features dense."""
    batch, _ = element
    return densify(batch, shapes)


def temp_dir_for(run: RunSpec, temp_location: str | None) -> str:
    """Where tf.Transform writes its intermediate files (the SavedModel before it is published): under
    ``--temp_location`` when given (the runner's shared storage), else a local directory, which every worker of
    a runner on this machine (DirectRunner, a Portable worker pool, Dask's LocalCluster) sees."""
    if temp_location:
        return f"{temp_location.rstrip('/')}/snapfeed-tft-{run.run_id}"
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"snapfeed-tft-{run.run_id}")


class AnalyzeAndTransform(beam.PTransform):
    """Raw batches in TFXIO's form -> (the transformed batches, dense; the run's graph files as ``RunFile``s).

    Applied while building the pipeline: tf.Transform traces the function then,
    in ``tft_beam.Context(temp_dir)``.
    """

    def __init__(self, fn: Callable, schema, run: RunSpec, temp_dir: str) -> None:
        super().__init__()
        self._fn = fn
        self._schema = schema
        self._run = run
        self._temp_dir = temp_dir

    def expand(self, raw):
        import tensorflow as tf

        try:
            return self._expand(raw)
        except tf.errors.OpError as exc:  # tf.Transform writes the traced function under its temp dir now
            detail = " ".join(str(exc).split())[:400]
            raise StorageError(
                f"tf.Transform cannot write its temp files under {self._temp_dir} ({type(exc).__name__}: {detail}); "
                f"give --temp_location a location this machine and the workers can write"
            ) from exc

    def _expand(self, raw):
        import_tft(FLAG)
        import tensorflow_transform.beam as tft_beam
        from tensorflow_transform.beam.tft_beam_io import beam_metadata_io

        config = raw_features.tensor_adapter_config(self._schema)
        with contextlib.ExitStack() as context:
            context.enter_context(tft_beam.Context(temp_dir=self._temp_dir))
            (transformed, metadata), transform_fn = (
                raw,
                config,
            ) | "AnalyzeAndTransformDataset" >> tft_beam.AnalyzeAndTransformDataset(
                self._fn, output_record_batches=True
            )
            saved_model_dir, transform_metadata = transform_fn
            metadata_dir = transform_metadata | "WriteMetadataToTemp" >> beam_metadata_io.WriteMetadata(
                os.path.join(self._temp_dir, "transformed_metadata"), raw.pipeline, write_to_unique_subdirectory=True
            )
        shapes = fixed_shapes(metadata.dataset_metadata.schema)
        batches = transformed | "DenseColumns" >> beam.Map(_dense_batch, shapes)
        files = (
            raw.pipeline
            | "CreateGraphStep" >> beam.Create([None])
            | "PublishGraph"
            >> beam.FlatMap(
                transform_graph.publish,
                run_dir=self._run.paths.run_dir(self._run.run_id),
                snapshot=self._run.paths,
                raw_schema_text=text_format.MessageToString(self._schema),
                transform_fn_dir=beam.pvalue.AsSingleton(saved_model_dir),
                metadata_dir=beam.pvalue.AsSingleton(metadata_dir),
            )
        )
        return batches, files
