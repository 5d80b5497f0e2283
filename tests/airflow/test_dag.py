"""The daily DAG against a real Airflow (sqlite metadata DB in a temp AIRFLOW_HOME), DirectRunner end to end."""

import json
import os
import shutil
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
        "materialize": ["snapshot_ready"],
        "snapshot_ready": ["verify"],
        "verify": ["train"],
        "train": [],
    }
    assert result["types"]["materialize"] == "MaterializeOperator"
    assert result["types"]["snapshot_ready"] == "SnapshotSensor"
    assert result["sensor_mode"] == "reschedule"


def test_dag_test_materializes_verifies_trains_and_a_rerun_reuses(airflow_env, tmp_path):
    day = tmp_path / "raw" / "2026-11-20"
    day.mkdir(parents=True)
    for source in DIGITS.glob("digits-*.tfrecord"):
        shutil.copy(source, day / source.name)
    output = tmp_path / "snapshots"
    conf = json.dumps({"input_pattern": str(tmp_path / "raw" / "{ds}" / "*.tfrecord"), "output_root": str(output)})

    first = run_in_airflow(airflow_env, "test", "2026-11-20T00:00:00+00:00", conf)
    assert first["state"] == "success", first
    assert set(first["tasks"].values()) == {"success"}
    snapshot = output / "digits-20261120"
    final = snapshot / "metadata.final"
    assert final.exists()
    manifest_before = final.read_bytes()
    runs_before = sorted(p.name for p in snapshot.glob("run-*"))

    second = run_in_airflow(airflow_env, "test", "2026-11-20T00:00:00+00:00", conf)
    assert second["state"] == "success", second
    assert final.read_bytes() == manifest_before, "the second run must reuse, not rewrite"
    assert sorted(p.name for p in snapshot.glob("run-*")) == runs_before


def test_exit_code_3_retries_other_failures_fail_and_the_sensor_fails_on_a_failed_run(airflow_env, tmp_path):
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
