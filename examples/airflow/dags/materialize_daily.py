"""Daily snapshot DAG: materialize the day into a view -> wait for the view version -> verify -> train on the window.

The ``input_pattern`` param is templated with the run date: ``{ds}`` in it becomes
the run's date (e.g. ``gs://bucket/raw/{ds}/*.tfrecord``). Each day's snapshot is
named ``{snapshot_prefix}-{ds_nodash}``, so a rerun of the same day reuses it
instead of writing it again, and the job adds it to the view ``view``
(``--view``) as a new version keeping the newest ``view_keep`` days
(``--view_keep``); a rerun of the day adds nothing. ``view_ready`` waits for a
version listing the day's snapshot and hands ``VIEW@K`` to ``train``, which
reads that version: the window of the last ``view_keep`` days, every row once.
The defaults read the bundled digits data (no ``{ds}`` in it) and write under
/tmp. Replace ``train`` with your training task; here it writes what it read
(the version, its snapshots, the rows and, when the rows have an ``id``
column, their count and a checksum of the sorted ids) to
``{reports}/train-{ds_nodash}.json``.

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

from beam_jobs.airflow import ViewSensor, materialize_operator

EXAMPLES = pathlib.Path(__file__).resolve().parents[2]
SNAPSHOT_NAME = "{{ params.snapshot_prefix }}-{{ ds_nodash }}"
SNAPSHOT = "{{ params.output_root }}/" + SNAPSHOT_NAME
VIEW_VERSION = "{{ ti.xcom_pull(task_ids='view_ready', key='view_version') }}"
REPORT = "{{ params.reports }}/train-{{ ds_nodash }}.json"


def verify_snapshot(snapshot_path: str) -> None:
    """`snapfeed verify`: fails the task naming every bad shard."""
    from reader.snapshots import main

    if main(["verify", snapshot_path]) != 0:
        raise RuntimeError(f"snapfeed verify found bad shards in {snapshot_path}; see the log")


def train(view_version: str, report_path: str) -> int:
    """Placeholder: replace with your trainer (reader.distributed_dataset / reader.dataset over the view).

    Reads one epoch of ``view_version`` (``VIEW@K``) and writes what it read to ``report_path``.
    """
    import hashlib
    import json

    import numpy as np

    import reader
    from schemas import storage, views

    version = views.read_version(*views.split_pinned(view_version))
    dataset = reader.distributed_dataset(view_version, 256, seed=0)
    rows, ids = 0, []
    for step in dataset:
        rows += len(next(iter(step.values())))
        if "id" in step:
            ids.append(np.asarray(step["id"], dtype=np.int64))
    report = {"view_version": view_version, "snapshots": [m.directory for m in version.members], "rows": rows}
    if ids:
        ordered = np.sort(np.concatenate(ids))
        report["ids"] = {"count": int(ordered.size), "sha256": hashlib.sha256(ordered.tobytes()).hexdigest()}
    storage.make_dirs(report_path.rsplit("/", 1)[0])
    storage.atomic_write(report_path, (json.dumps(report, indent=1) + "\n").encode())
    print(f"trained one epoch over {rows} rows of {view_version} ({len(version.members)} snapshots)")
    return rows


with DAG(
    dag_id="snapfeed_materialize_daily",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "input_pattern": Param(str(EXAMPLES / "data" / "digits" / "digits-*.tfrecord"), type="string"),
        "schema": Param(str(EXAMPLES / "data" / "digits" / "schema.pbtxt"), type="string"),
        "preprocessing_fn": Param("examples.digits_prep:preprocess", type="string"),
        "preprocessing_params": Param('{"scale": 0.0625}', type="string"),
        "output_root": Param("/tmp/snapfeed/snapshots", type="string"),
        "snapshot_prefix": Param("digits", type="string"),
        "view": Param("/tmp/snapfeed/views/digits", type="string"),
        "view_keep": Param(7, type="integer", minimum=1),
        "reports": Param("/tmp/snapfeed/reports", type="string"),
    },
    tags=["snapfeed"],
) as dag:
    materialize = materialize_operator(
        "materialize",
        pipeline_options={
            "input": "{{ params.input_pattern.replace('{ds}', ds) }}",
            "input_format": "tfrecord",
            "schema": "{{ params.schema }}",
            "preprocessing_fn": "{{ params.preprocessing_fn }}",
            "preprocessing_params": "{{ params.preprocessing_params }}",
            "output": "{{ params.output_root }}",
            "snapshot_name": SNAPSHOT_NAME,
            "view": "{{ params.view }}",
            "view_keep": "{{ params.view_keep }}",
        },
    )
    view_ready = ViewSensor(
        task_id="view_ready",
        view="{{ params.view }}",
        root="{{ params.output_root }}",
        snapshot_name=SNAPSHOT_NAME,
        mode="reschedule",
        poke_interval=60,
        timeout=6 * 3600,
    )
    verify = PythonOperator(task_id="verify", python_callable=verify_snapshot, op_args=[SNAPSHOT])
    train_task = PythonOperator(task_id="train", python_callable=train, op_args=[VIEW_VERSION, REPORT])

    materialize >> view_ready >> verify >> train_task
