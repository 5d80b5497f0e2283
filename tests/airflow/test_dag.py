"""The daily DAG against a real Airflow (sqlite metadata DB in a temp AIRFLOW_HOME), DirectRunner end to end."""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from tests import helpers

# Airflow lives in its own environment (`make install-airflow`; `make test` sets this variable):
# tfx-bsl and the Google provider cannot share one. The DAG runs the job with this interpreter.
AIRFLOW_PYTHON = os.environ.get("SNAPFEED_AIRFLOW_PYTHON", "")
pytestmark = pytest.mark.skipif(
    not os.path.exists(AIRFLOW_PYTHON), reason="needs SNAPFEED_AIRFLOW_PYTHON (run `make test`)"
)

DIGITS = helpers.REPO_ROOT / "examples" / "data" / "digits"


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory):
    home = tmp_path_factory.mktemp("airflow_home")
    env = helpers.cli_env(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_FOLDER=str(helpers.REPO_ROOT / "examples" / "airflow" / "dags"),
        AIRFLOW__LOGGING__LOGGING_LEVEL="WARNING",
        SNAPFEED_JOB_PYTHON=sys.executable,
    )
    subprocess.run(
        [AIRFLOW_PYTHON, "-m", "airflow", "db", "migrate"], env=env, check=True, capture_output=True, timeout=600
    )
    return env


def run_in_airflow(env, *args, timeout=600) -> dict:
    completed = subprocess.run(
        [AIRFLOW_PYTHON, "-m", "tests.airflow.dag_runner", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=helpers.REPO_ROOT,
        check=False,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert completed.returncode == 0 and lines, completed.stdout[-3000:] + completed.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_dagbag_imports_cleanly_and_the_graph_is_as_documented(airflow_env):
    result = run_in_airflow(airflow_env, "inspect")
    assert result["heavy_modules"] == [], "DAG parsing must not import Beam or TensorFlow"
    assert result["import_errors"] == {}
    assert result["graph"] == {
        "materialize": ["view_ready"],
        "view_ready": ["verify"],
        "verify": ["train"],
        "train": [],
    }
    assert result["types"]["materialize"] == "MaterializeOperator"
    assert result["types"]["view_ready"] == "ViewSensor"
    assert result["sensor_mode"] == "reschedule"


ROWS_PER_DAY = 300
DAYS = ["2026-11-20", "2026-11-21", "2026-11-22"]


def run_days(env, conf: dict, *dates: str) -> list[dict]:
    runs = run_in_airflow(env, "test", json.dumps(conf), *dates, timeout=900)
    for run in runs:
        assert run["state"] == "success", run
        assert set(run["tasks"].values()) == {"success"}, run
    return runs


def ids_digest(ids) -> str:
    """What the DAG's train task records of the ids it read: sha256 of them sorted, as int64."""
    import numpy as np

    return hashlib.sha256(np.sort(np.asarray(list(ids), dtype=np.int64)).tobytes()).hexdigest()


@pytest.mark.timeout(1200)
def test_three_days_each_add_a_view_version_and_the_third_trains_on_all_three_days_once(airflow_env, tmp_path):
    """Day d's raw rows have ids d*300 .. d*300+299; the DAG keeps them (tests.prep_functions:normalize)."""
    raw = tmp_path / "raw"
    for index, day in enumerate(DAYS):
        helpers.write_tfrecords(raw / day, num_rows=ROWS_PER_DAY, num_files=1, start=index * ROWS_PER_DAY)
    output, view, reports = tmp_path / "snapshots", tmp_path / "views" / "daily", tmp_path / "reports"
    conf = {
        "input_pattern": str(raw / "{ds}" / "*.tfrecord"),
        "schema": str(helpers.write_schema(raw / "schema.pbtxt")),
        "preprocessing_fn": "tests.prep_functions:normalize",
        "preprocessing_params": '{"scale": 2}',
        "output_root": str(output),
        "view": str(view),
        "view_keep": 3,
        "reports": str(reports),
    }
    from schemas import views

    # The first day, then the same day again: the rerun reuses the snapshot and adds no version.
    run_days(airflow_env, conf, DAYS[0], DAYS[0])
    first = output / "digits-20261120"
    assert len(list(first.glob("run-*"))) == 1, "the rerun must reuse, not rewrite"
    assert views.version_numbers(str(view)) == [1]
    report = json.loads((reports / "train-20261120.json").read_text())
    assert report["view_version"] == f"{view}@1" and report["rows"] == ROWS_PER_DAY

    run_days(airflow_env, conf, *DAYS[1:])
    assert views.version_numbers(str(view)) == [1, 2, 3]
    second = json.loads((reports / "train-20261121.json").read_text())
    assert (second["view_version"], second["rows"]) == (f"{view}@2", 2 * ROWS_PER_DAY)
    third = json.loads((reports / "train-20261122.json").read_text())
    assert third["view_version"] == f"{view}@3"
    assert third["snapshots"] == [str(output / f"digits-{day.replace('-', '')}") for day in DAYS]
    assert third["rows"] == 3 * ROWS_PER_DAY
    assert third["ids"] == {"count": 3 * ROWS_PER_DAY, "sha256": ids_digest(range(3 * ROWS_PER_DAY))}, (
        "the third day trained on every row of the three days, each once"
    )


def test_exit_code_3_retries_other_failures_fail_and_the_sensors_fail_on_a_failed_run(airflow_env, tmp_path):
    from beam_jobs.writing import commit

    output = tmp_path / "snapshots"
    pending = commit.RunSpec(root=str(output), snapshot_id="busy-day", run_id=commit.new_run_id())
    commit.begin_run(pending)
    failed = commit.RunSpec(root=str(output), snapshot_id="bad-day", run_id=commit.new_run_id())
    commit.begin_run(failed)
    commit.mark_failed(failed, "preprocessing_fn raised ValueError")
    # A writer that began a run and died without a word (kill -9): its process is gone.
    begin = f"from beam_jobs.writing import commit; commit.begin_run(commit.RunSpec(root={str(output)!r}, snapshot_id='gone-day', run_id=commit.new_run_id()))"
    subprocess.run([sys.executable, "-c", begin], check=True, env=helpers.cli_env())
    # Two finalized snapshots, one of them added to a view.
    from schemas import metadata, views
    from schemas.paths import SnapshotPaths
    from testing import snapshots

    view = tmp_path / "views" / "daily"
    for name in ("listed-day", "unlisted-day"):
        snapshots.write_snapshot(output, name, [snapshots.random_batch("100B", 0, 10)])
    listed = SnapshotPaths(str(output), "listed-day")
    views.add(str(view), listed, metadata.read_manifest(listed))
    conf = {
        "options": {
            "input": str(DIGITS / "digits-*.tfrecord"),
            "schema": str(DIGITS / "schema.pbtxt"),
            "output": str(output),
        },
        "pending": "busy-day",
        "failed": "bad-day",
        "abandoned": "gone-day",
        "missing_input": str(tmp_path / "nothing" / "*.tfrecord"),
        "view": str(view),
        "listed": "listed-day",
        "unlisted": "unlisted-day",
    }
    result = run_in_airflow(airflow_env, "exit_codes", json.dumps(conf))
    assert result["in_progress"].startswith("retry:") and "exit 3" in result["in_progress"]
    assert result["no_input"].startswith("fail:") and "exit 1" in result["no_input"]
    assert result["usage"].startswith("fail:") and "exit 2" in result["usage"]
    assert (
        result["sensor_failed"].startswith("fail:") and "preprocessing_fn raised ValueError" in result["sensor_failed"]
    )
    assert result["sensor_abandoned"].startswith("fail:") and "was abandoned" in result["sensor_abandoned"]
    assert result["sensor_pending"] is False
    assert (
        result["view_sensor_failed"].startswith("fail:") and "preprocessing_fn raised" in result["view_sensor_failed"]
    )
    assert result["view_sensor_abandoned"].startswith("fail:") and "was abandoned" in result["view_sensor_abandoned"]
    assert result["view_sensor_pending"] is False and result["view_sensor_unlisted"] is False
    assert result["view_sensor_listed"] == [True, {"view_version": f"{view}@1", "snapshot_path": listed.directory}]
