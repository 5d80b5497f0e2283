"""Airflow integration: run the materialize job and wait for its snapshot or for a view version listing it
(``pip install snapfeed[airflow]``).

Importable at DAG-parse time: it imports Airflow and the snapshot contract in
``schemas/`` (protobuf + pyarrow), never Apache Beam or TensorFlow; the job
itself runs in a child process started by the Beam provider's operator.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from schemas import metadata, paths, storage, views, writer_process
from schemas.errors import EXIT_FAILURE, EXIT_IN_PROGRESS, EXIT_USAGE
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import Manifest, RunState
from schemas.state_machine import describe_pending

#: Of the job's exit codes (schemas.errors) only EXIT_IN_PROGRESS, another writer, is worth retrying.
_RETURN_CODE = re.compile(r"return code (\d+)")


class MaterializeOperator(BeamRunPythonPipelineOperator):
    """``python -m beam_jobs.materialize`` through the Beam provider, with the job's exit codes mapped.

    Exit 3 (another writer holds the snapshot) raises a retryable error, so the
    task goes up for retry; exit 1 (failure) and 2 (usage error) fail the task
    at once, since retrying would not change the input or the flags.
    """

    def execute(self, context: Any):
        try:
            return super().execute(context)
        except AirflowFailException:
            raise
        except AirflowException as exc:
            match = _RETURN_CODE.search(str(exc))
            code = int(match.group(1)) if match else None
            if code == EXIT_IN_PROGRESS:
                raise AirflowException(
                    "another writer is materializing this snapshot (exit 3); the task will retry"
                ) from exc
            what = {EXIT_USAGE: "a usage error (check the pipeline options)", EXIT_FAILURE: "a failure"}.get(
                code, "an unexpected error"
            )
            raise AirflowFailException(f"materialize ended with {what} (exit {code}); see the log above") from exc


def materialize_operator(
    task_id: str,
    *,
    pipeline_options: dict[str, Any],
    runner: str = "DirectRunner",
    dataflow_config: Any = None,
    py_interpreter: str | None = None,
    retries: int = 12,
    retry_delay: timedelta = timedelta(minutes=5),
    **operator_kwargs: Any,
) -> MaterializeOperator:
    """A task running the materialize job with ``pipeline_options`` (templated) on ``runner``.

    Locally use the DirectRunner; in production ``runner="DataflowRunner"`` with
    ``dataflow_config=DataflowConfiguration(job_name=..., project_id=..., location=...)``.
    ``retries`` apply to exit code 3 only (see ``MaterializeOperator``). The job runs
    with ``py_interpreter``: default ``$SNAPFEED_JOB_PYTHON``, else Airflow's own
    interpreter; point it at the environment that has snapfeed's Beam stack.
    """
    if not pipeline_options.get("output") or not pipeline_options.get("input"):
        raise ValueError(f"{task_id}: pipeline_options needs 'input' and 'output' (the job's --input/--output)")
    return MaterializeOperator(
        task_id=task_id,
        py_file="beam_jobs.materialize",
        py_options=["-m"],
        runner=runner,
        pipeline_options=dict(pipeline_options),
        dataflow_config=dataflow_config,
        py_interpreter=py_interpreter or os.environ.get("SNAPFEED_JOB_PYTHON") or sys.executable,
        retries=retries,
        retry_delay=retry_delay,
        **operator_kwargs,
    )


def _finalized(snapshot: SnapshotPaths, log) -> Manifest | None:
    """The snapshot's manifest once finalized, else None (logged); a failed or abandoned run fails the task."""
    manifest = metadata.read_manifest(snapshot)
    if manifest is not None:
        return manifest
    pending = metadata.read_pending(snapshot)
    if pending is not None and pending.state == RunState.FAILED:
        raise AirflowFailException(
            f"snapshot {snapshot.directory} is marked failed: {describe_pending(pending)}. "
            f"Fix the cause and rerun the materialize task."
        )
    if pending is not None and writer_process.pending_writer_gone(pending):
        raise AirflowFailException(
            f"snapshot {snapshot.directory} was abandoned: the writer of {describe_pending(pending)} is gone "
            f"(killed?). Rerun the materialize task; it takes the snapshot over at once."
        )
    log.info("%s: %s", snapshot.directory, describe_pending(pending) if pending else "not started")
    return None


class SnapshotSensor(BaseSensorOperator):
    """Succeeds when a finalized snapshot exists under ``root``: by name, by id, or the newest.

    Pokes read markers only (``metadata.final`` / ``snapshot.metadata``), never
    shards. Fails at once when the awaited snapshot's run is marked failed, or
    was abandoned by a writer on this host whose process is gone.
    Pushes the snapshot directory to XCom. Supports ``mode="reschedule"``.
    """

    template_fields: Sequence[str] = ("root", "snapshot_name", "snapshot_id")

    def __init__(
        self, *, root: str, snapshot_name: str | None = None, snapshot_id: str | None = None, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        if snapshot_name and snapshot_id:
            raise ValueError("SnapshotSensor takes snapshot_name or snapshot_id, not both")
        self.root = root
        self.snapshot_name = snapshot_name
        self.snapshot_id = snapshot_id

    def _check_one(self, snapshot: SnapshotPaths) -> Manifest | None:
        return _finalized(snapshot, self.log)

    def _newest(self) -> tuple[SnapshotPaths, Manifest] | None:
        finalized = []
        for entry in storage.list_dir(self.root):
            if entry.is_dir and paths.is_valid_snapshot_id(entry.name):
                snapshot = SnapshotPaths(self.root, entry.name)
                manifest = metadata.read_manifest(snapshot)
                if manifest is not None:
                    finalized.append((manifest.finalize_time, snapshot, manifest))
        return max(finalized, key=lambda f: f[0])[1:] if finalized else None

    def poke(self, context: Any) -> bool:
        wanted = self.snapshot_id or self.snapshot_name
        if wanted:
            snapshot = SnapshotPaths(self.root, wanted)
            manifest = self._check_one(snapshot)
        else:
            found = self._newest()
            snapshot, manifest = found if found else (None, None)
        if manifest is None:
            return False
        self.log.info("finalized: %s (%d rows, run %s)", snapshot.directory, manifest.num_rows, manifest.run_id)
        context["ti"].xcom_push(key="snapshot_path", value=snapshot.directory)
        return True


class ViewSensor(BaseSensorOperator):
    """Succeeds when a version of ``view`` lists the finalized run of the snapshot ``snapshot_name`` under ``root``
    (what the job's ``--view`` adds once it has written or reused the snapshot).

    Pokes markers and the view's version files only (``schemas.views``), never
    shards, so ``mode="reschedule"`` works. Fails at once, as ``SnapshotSensor``
    does, when the snapshot's run is marked failed or was abandoned. A version
    listing an older run of the snapshot (before a ``--mode=write``) does not
    count: the sensor waits for one listing the run that is final now. Pushes
    ``view_version`` (``VIEW@K``, the newest version listing the run: a trainer
    given it reads exactly that window, whatever is added later) and
    ``snapshot_path`` to XCom.
    """

    template_fields: Sequence[str] = ("view", "root", "snapshot_name")

    def __init__(self, *, view: str, root: str, snapshot_name: str, **kwargs) -> None:
        super().__init__(**kwargs)
        if not view or not root or not snapshot_name:
            raise ValueError(
                "ViewSensor needs view, root and snapshot_name (the job's --view, --output, --snapshot_name)"
            )
        self.view = view
        self.root = root
        self.snapshot_name = snapshot_name

    def poke(self, context: Any) -> bool:
        snapshot = SnapshotPaths(self.root, self.snapshot_name)
        manifest = _finalized(snapshot, self.log)
        if manifest is None:
            return False
        if not views.is_view(self.view):
            self.log.info("%s is finalized; no view at %s yet", snapshot.directory, self.view)
            return False
        listing = views.listed_runs(self.view).get((snapshot.snapshot_id, manifest.run_id))
        if not listing:
            self.log.info("%s (run %s): no version of %s lists it yet", snapshot.directory, manifest.run_id, self.view)
            return False
        version = f"{self.view}@{max(listing)}"
        self.log.info("%s lists %s (run %s, %d rows)", version, snapshot.directory, manifest.run_id, manifest.num_rows)
        context["ti"].xcom_push(key="view_version", value=version)
        context["ti"].xcom_push(key="snapshot_path", value=snapshot.directory)
        return True
