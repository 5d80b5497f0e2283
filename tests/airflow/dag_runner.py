"""Runs inside a child process whose AIRFLOW_HOME is a fresh, migrated sqlite DB (see test_dag.py).

``python -m tests.airflow.dag_runner inspect`` prints the DagBag's import errors
and task graph; ``... test <conf-json> <date> [<date> ...]`` runs ``dag.test()`` for each
date in turn (one process: Airflow starts once) and prints the final state of every
task instance of each run. Output: one JSON line.
"""

import json
import sys

import pendulum


def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    from tests.helpers import REPO_ROOT

    return DagBag(dag_folder=str(REPO_ROOT / "examples" / "airflow" / "dags"))


def inspect() -> dict:
    bag = dagbag()
    dag = bag.dags.get("snapfeed_materialize_daily")
    graph = {task.task_id: sorted(task.downstream_task_ids) for task in dag.tasks} if dag else {}
    types = {task.task_id: type(task).__name__ for task in dag.tasks} if dag else {}
    sensor = dag.get_task("view_ready") if dag else None
    return {
        "heavy_modules": sorted(m for m in ("apache_beam", "tensorflow") if m in sys.modules),
        "import_errors": {k: str(v) for k, v in bag.import_errors.items()},
        "graph": graph,
        "types": types,
        "sensor_mode": sensor.mode if sensor else None,
        "schedule": str(dag.schedule) if dag else None,
    }


def test(conf: dict, dates: list[str]) -> list[dict]:
    dag = dagbag().dags["snapfeed_materialize_daily"]
    runs = []
    for date in dates:
        run = dag.test(logical_date=pendulum.parse(date), run_conf=conf)
        runs.append(
            {
                "date": date,
                "state": str(run.state),
                "tasks": {ti.task_id: str(ti.state) for ti in run.get_task_instances()},
            }
        )
    return runs


def _outcome(call) -> str:
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    try:
        call()
    except AirflowFailException as exc:
        return f"fail: {exc}"
    except AirflowException as exc:
        return f"retry: {exc}"
    return "ok"


def exit_codes(conf: dict) -> dict:
    """The operator's mapping of the job's exit codes, and the sensor on failed and abandoned snapshots."""
    from beam_jobs.airflow import SnapshotSensor, ViewSensor, materialize_operator

    def job(task_id: str, **options):
        operator = materialize_operator(task_id, pipeline_options={**conf["options"], **options}, retries=3)
        return lambda: operator.execute({})

    class TaskInstance:
        def __init__(self):
            self.pushed = {}

        def xcom_push(self, key, value):
            self.pushed[key] = value

    sensor = SnapshotSensor(task_id="sensor", root=conf["options"]["output"], snapshot_name=conf["failed"])

    def view_sensor(name: str) -> ViewSensor:
        return ViewSensor(task_id=f"view_{name}", view=conf["view"], root=conf["options"]["output"], snapshot_name=name)

    return {
        "in_progress": _outcome(job("busy", snapshot_name=conf["pending"])),
        "no_input": _outcome(job("missing", input=conf["missing_input"], snapshot_name="x")),
        "usage": _outcome(job("usage", compression="GZIP", snapshot_name="y")),
        "sensor_failed": _outcome(lambda: sensor.poke({"ti": TaskInstance()})),
        "sensor_abandoned": _outcome(
            lambda: SnapshotSensor(
                task_id="abandoned", root=conf["options"]["output"], snapshot_name=conf["abandoned"]
            ).poke({"ti": TaskInstance()})
        ),
        "sensor_pending": SnapshotSensor(
            task_id="pending", root=conf["options"]["output"], snapshot_name=conf["pending"]
        ).poke({"ti": TaskInstance()}),
        "view_sensor_failed": _outcome(lambda: view_sensor(conf["failed"]).poke({"ti": TaskInstance()})),
        "view_sensor_abandoned": _outcome(lambda: view_sensor(conf["abandoned"]).poke({"ti": TaskInstance()})),
        "view_sensor_pending": view_sensor(conf["pending"]).poke({"ti": TaskInstance()}),
        "view_sensor_unlisted": view_sensor(conf["unlisted"]).poke({"ti": TaskInstance()}),
        "view_sensor_listed": _poked(view_sensor(conf["listed"]), TaskInstance()),
    }


def _poked(sensor, ti) -> list:
    """What a poke returned and what it pushed to XCom."""
    return [sensor.poke({"ti": ti}), ti.pushed]


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "inspect":
        result = inspect()
    elif command == "exit_codes":
        result = exit_codes(json.loads(sys.argv[2]))
    else:
        result = test(json.loads(sys.argv[2]), sys.argv[3:])
    print("RESULT " + json.dumps(result, default=str))
