"""The job's Beam graph: Read -> Preprocess -> WriteSnapshot, and nothing else.

Thin, like Beam's ``WriteToParquet`` over its sink: it only wires up the
transforms that do the work, ``ReadRecordBatches`` (``beam_jobs.inputs``), the
user's function (``PreprocessFn``, or tf.Transform's ``AnalyzeAndTransform``
for a ``--tft_preprocessing_fn``) and ``WriteSnapshot`` (``beam_jobs.writing``).
Whether to write at all, the run it writes and what happens when it fails are
the driver's (``beam_jobs.materialize``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.inputs import plan as input_plan
from beam_jobs.inputs.sources import ReadRecordBatches
from beam_jobs.preprocessing import raw_features, tf_transform, tft_window
from beam_jobs.preprocessing.batch_fn import PreprocessFn
from beam_jobs.writing import commit
from beam_jobs.writing.write_snapshot import WriteSnapshot, count_rows

if TYPE_CHECKING:
    from beam_jobs.job_plan import JobPlan


def build_pipeline(options: PipelineOptions, job: JobPlan, run: commit.RunSpec):
    """The graph that writes ``run`` of ``job``'s snapshot; built, not run."""
    config, inputs = job.config, job.inputs
    tft = job.preprocessing.tf_transform
    pipeline = beam.Pipeline(options=options)
    batches = pipeline | "ReadInputs" >> ReadRecordBatches(
        input_format=config.input_format,
        pieces=tuple(
            input_plan.plan_pieces(
                config.input_format,
                [(f.path, f.size_bytes) for f in inputs.files],
                csv_piece_bytes=input_plan.DEFAULT_CSV_PIECE_BYTES,
            )
        ),
        schema=inputs.raw_schema if tft else inputs.schema,
        csv_column_names=inputs.csv_column_names,
        csv_skip_header_lines=inputs.csv_skip_header_lines,
        tfxio_form=tft,
    )
    rows_read = count_rows(batches, "Read")
    run_files = None
    if tft:
        raw = batches | "TFXIOColumns" >> beam.Map(
            raw_features.to_tfxio, raw_features.tfxio_arrow_schema(inputs.raw_schema)
        )
        if job.preprocessing.window:  # --view: the raw rows, the day's graph and its analyzer cache
            batches, run_files = raw | "TFTransformDay" >> tft_window.AnalyzeDay(
                job.preprocessing.fn, inputs.raw_schema, run, job.tft_temp_dir(run)
            )
        else:
            batches, run_files = raw | "TFTransform" >> tf_transform.AnalyzeAndTransform(
                job.preprocessing.fn, inputs.raw_schema, run, job.tft_temp_dir(run)
            )
    elif config.preprocessing_fn:
        batches = batches | "Preprocess" >> beam.ParDo(
            PreprocessFn(config.preprocessing_fn, config.preprocessing_params)
        )
    _ = batches | "WriteSnapshot" >> WriteSnapshot(
        run=run,
        compression=config.compression,
        shard_size_bytes=config.shard_size_bytes,
        block_size_bytes=config.block_size_bytes,
        allow_empty=config.allow_empty,
        rows_read=rows_read,
        run_files=run_files,
    )
    return pipeline
