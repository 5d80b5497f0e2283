"""Daily snapshot DAG: materialize -> wait for the final snapshot -> verify it -> train.

The ``input_pattern`` param is templated with the run date: ``{ds}`` in it becomes
the run's date (e.g. ``gs://bucket/raw/{ds}/*.tfrecord``). Each day's snapshot is
named ``{snapshot_prefix}-{ds_nodash}``, so a rerun of the same day reuses it
instead of writing it again. The defaults read the bundled digits data (no
``{ds}`` in it) and write under /tmp. Replace ``train`` with your training task.

The job runs with ``$SNAPFEED_JOB_PYTHON`` (the environment with snapfeed's Beam
stack; Airflow's own environment only needs ``snapfeed[airflow]``).
Production: pass ``runner="DataflowRunner"`` and a ``DataflowConfiguration`` to
``materialize_operator`` and point the paths at gs://.
"""

from __future__ import annotations

import pathlib

import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Param

from beam_jobs.airflow import SnapshotSensor, materialize_operator

EXAMPLES = pathlib.Path(__file__).resolve().parents[2]
SNAPSHOT = "{{ params.output_root }}/{{ params.snapshot_prefix }}-{{ ds_nodash }}"


def verify_snapshot(snapshot_path: str) -> None:
    """`snapfeed verify`: fails the task naming every bad shard."""
    from reader.snapshots import main

    if main(["verify", snapshot_path]) != 0:
        raise RuntimeError(f"snapfeed verify found bad shards in {snapshot_path}; see the log")


def train(snapshot_path: str) -> int:
    """Placeholder: replace with your trainer (reader.distributed_dataset / reader.dataset)."""
    import reader

    dataset = reader.distributed_dataset(snapshot_path, 256, seed=0)
    rows = sum(len(next(iter(step.values()))) for step in dataset)
    print(f"trained one epoch over {rows} rows of {snapshot_path}")
    return rows


with DAG(
    dag_id="snapfeed_materialize_daily",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "input_pattern": Param(str(EXAMPLES / "data" / "digits" / "digits-*.tfrecord"), type="string"),
        "schema": Param(str(EXAMPLES / "data" / "digits" / "schema.pbtxt"), type="string"),
        "output_root": Param("/tmp/snapfeed/snapshots", type="string"),
        "snapshot_prefix": Param("digits", type="string"),
    },
    tags=["snapfeed"],
) as dag:
    materialize = materialize_operator(
        "materialize",
        pipeline_options={
            "input": "{{ params.input_pattern.replace('{ds}', ds) }}",
            "input_format": "tfrecord",
            "schema": "{{ params.schema }}",
            "preprocessing_fn": "examples.digits_prep:preprocess",
            "preprocessing_params": '{"scale": 0.0625}',
            "output": "{{ params.output_root }}",
            "snapshot_name": "{{ params.snapshot_prefix }}-{{ ds_nodash }}",
        },
    )
    snapshot_ready = SnapshotSensor(
        task_id="snapshot_ready",
        root="{{ params.output_root }}",
        snapshot_name="{{ params.snapshot_prefix }}-{{ ds_nodash }}",
        mode="reschedule",
        poke_interval=60,
        timeout=6 * 3600,
    )
    verify = PythonOperator(task_id="verify", python_callable=verify_snapshot, op_args=[SNAPSHOT])
    train_task = PythonOperator(task_id="train", python_callable=train, op_args=[SNAPSHOT])

    materialize >> snapshot_ready >> verify >> train_task
