"""``python -m beam_jobs.materialize``: preprocess raw files once into a finalized snapshot.

The driver parses the flags, has the job planned (``beam_jobs.job_plan``: the
inputs matched, the function loaded, the fingerprint), asks the state machine
whether to write, reuse or wait, writes the pending marker, runs the Beam pipeline
(``beam_jobs.pipeline``: Read -> Preprocess -> WriteSnapshot) on any runner,
and prints one summary line. Exit codes (``schemas.errors``): 0 written or reused, 3 another writer in
progress, 2 usage error, 1 failure; every failure ends in one ``error:`` line.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
import time

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TestOptions
from apache_beam.runners.runner import PipelineState

from beam_jobs import failures, flags, job_plan
from beam_jobs.inputs import row_estimate
from beam_jobs.interruption import Interrupted, Signals, signals_interrupt_run
from beam_jobs.job_plan import JobPlan
from beam_jobs.options import MaterializeConfig, MaterializeOptions
from beam_jobs.pipeline import build_pipeline
from beam_jobs.preprocessing import tft_window
from beam_jobs.progress import ProgressReporter
from beam_jobs.runners import checks as runner_checks
from beam_jobs.runners import direct_runner, worker_packages
from beam_jobs.runners.remote_job import RemoteJob
from beam_jobs.writing import commit
from schemas import command, metadata, storage, views, writer_process
from schemas.errors import EXIT_IN_PROGRESS, EXIT_OK, IncompleteRunError, RunInterruptedError, SnapfeedError, UsageError
from schemas.fingerprint_diff import explain_difference
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import Manifest
from schemas.state_machine import Action, Decision, decide


@dataclasses.dataclass(frozen=True)
class MaterializeResult:
    """What the summary line says, as data."""

    path: str
    state: str  # "written" | "reused" | "in progress by run X since T ..."
    rows: int
    shards: int
    bytes: int
    seconds: float
    snapshot_id: str = ""
    run_id: str = ""
    worker_image: str = ""  # a dry run: the image the translated job names for its workers
    staged: tuple[str, ...] = ()  # a dry run: the files staged for the workers to install
    view_version: views.Version | None = None  # --view: the version that lists this run (new or the latest)
    view_added: bool = False  # --view: whether this job made that version (False: a rerun found its run listed)
    tft_analysis: dict | None = None  # tf.Transform with --view: what the run's own analysis read (tft_window)

    @property
    def in_progress(self) -> bool:
        return self.state.startswith("in progress")

    def summary(self) -> str:
        """The last line; a written run adds its rows/s (a reuse reads no rows)."""
        rate = (
            f" rows_per_second={self.rows / self.seconds:.0f}" if self.state == "written" and self.seconds > 0 else ""
        )
        view = f" view={self.view_version.view}@{self.view_version.number}" if self.view_version else ""
        return (
            f"{self.path} state={self.state} rows={self.rows} shards={self.shards} "
            f"bytes={self.bytes} seconds={self.seconds:.1f}{rate}{view}"
        )


def _result(snapshot: SnapshotPaths, state: str, manifest: Manifest | None, started: float) -> MaterializeResult:
    return MaterializeResult(
        path=snapshot.directory,
        state=state,
        rows=manifest.num_rows if manifest else 0,
        shards=len(manifest.shards) if manifest else 0,
        bytes=manifest.num_bytes if manifest else 0,
        seconds=time.monotonic() - started,
        snapshot_id=snapshot.snapshot_id,
        run_id=manifest.run_id if manifest else "",
    )


def _decide_until_writable(config: MaterializeConfig, snapshot: SnapshotPaths, *, lost_race: bool = False) -> Decision:
    """The state machine's decision (a loser's with ``lost_race``); polls while another writer is in progress and
    --wait is set."""
    while True:
        pending = metadata.read_pending(snapshot)
        decision = decide(
            mode=config.mode,
            pending=pending,
            manifest=metadata.read_manifest(snapshot),
            now=time.time(),
            expiry_seconds=config.pending_snapshot_expiry_seconds,
            writer_gone=pending is not None and writer_process.pending_writer_gone(pending),
            lost_race=lost_race,
        )
        if decision.action is not Action.PASSTHROUGH or not config.wait:
            return decision
        logging.warning("waiting: %s is %s", snapshot.directory, decision.reason)
        time.sleep(config.wait_poll_seconds)


def plan(argv: list[str] | None = None) -> JobPlan:
    """Parses the flags, matches the inputs and computes the fingerprint (``job_plan.resolve``); writes nothing."""
    started = time.monotonic()
    argv = sys.argv[1:] if argv is None else list(argv)
    options = flags.parse(argv)
    config = MaterializeConfig.from_options(options.view_as(MaterializeOptions))
    direct_runner.apply_defaults(options, argv, config.input_format)
    runner_checks.check(options, config)
    # Beam's s3:// (and other configurable) filesystems read their endpoint and credentials from the
    # options; the pipeline sets them only when it is built, after the inputs are matched here.
    FileSystems.set_options(options)
    return job_plan.resolve(options, config, started=started)


def run(argv: list[str] | None = None) -> MaterializeResult:
    """Runs the job; returns the summary or raises a ``SnapfeedError``."""
    return execute(plan(argv))


def _run_spec(job: JobPlan, decision: Decision) -> commit.RunSpec:
    return commit.RunSpec(
        root=job.config.output,
        snapshot_id=job.snapshot.snapshot_id,
        run_id=commit.new_run_id(),
        snapshot_name=job.config.snapshot_name or "",
        fingerprint=job.fingerprint,
        components=job.components.SerializeToString(),
        supersedes_run_id=decision.supersedes_run_id,
        raw_input_bytes=sum(f.size_bytes for f in job.inputs.files),
    )


def _reuse_state(config: MaterializeConfig, manifest: Manifest | None) -> str:
    """ "reused", plus what the flags asked for that the stored snapshot does not have."""
    stored = manifest.compression if manifest is not None else ""
    asked = config.compression.value.lower()
    if not config.compression_given or not stored or stored == asked:
        return "reused"
    return (
        f"reused (stored {stored.upper()}; --compression={asked.upper()} applies to new writes; --mode=write rewrites)"
    )


def execute(job: JobPlan) -> MaterializeResult:
    """Decides with the state machine, then reuses, reports the other writer, or writes; with ``--view``, adds the
    snapshot it wrote or reused to the view."""
    if job.options.view_as(TestOptions).dry_run:
        return _dry_run(job)
    result, manifest = _write_or_reuse(job)
    if job.config.view and manifest is not None:
        return _add_to_view(job, result, manifest)
    return result


def _write_or_reuse(job: JobPlan) -> tuple[MaterializeResult, Manifest | None]:
    """The summary and the finalized manifest it reports (None while another writer is in progress)."""
    config, snapshot = job.config, job.snapshot
    storage.check_output_root(config.output)
    decision = _decide_until_writable(config, snapshot)
    if decision.action is Action.READ:
        manifest = _same_fingerprint(job, metadata.read_manifest(snapshot))
        return _result(snapshot, _reuse_state(config, manifest), manifest, job.started), manifest
    if decision.action is Action.PASSTHROUGH:
        return _result(snapshot, decision.reason, None, job.started), None
    run_spec = _run_spec(job, decision)
    _stage_for_remote_workers(job.options)
    commit.begin_run(run_spec, runner=str(job.options.view_as(StandardOptions).runner or "DirectRunner"))
    logging.info("writing %s as %s (%s)", snapshot.directory, run_spec.run_id, decision.reason)
    remote = RemoteJob.for_options(job.options)
    with signals_interrupt_run() as signals:
        try:
            _run_pipeline(job, run_spec, remote)
        except (Interrupted, Exception) as exc:  # noqa: BLE001 - every failure is recorded, explained and re-raised
            if signals.received:  # whatever the runner made of the Interrupted raised in the main thread
                raise _record_interruption(run_spec, signals, remote) from None
            error = failures.explain(exc, config, job.inputs)
            _record_failure(run_spec, error)
            raise error from exc
    manifest = metadata.read_manifest(snapshot)
    if manifest is not None and manifest.run_id == run_spec.run_id:
        return _result(snapshot, "written", manifest, job.started), manifest
    pending = metadata.read_pending(snapshot)
    if pending is not None and pending.run_id == run_spec.run_id:
        error = SnapfeedError(
            f"the pipeline finished but run {run_spec.run_id} committed nothing to {snapshot.directory}: its "
            f"finalize step never ran or wrote elsewhere (workers that cannot reach --output={config.output}?). "
            f"The run is marked failed; a rerun starts over."
        )
        _record_failure(run_spec, error)
        raise error
    return _after_lost_race(job)


def _expected_rows(job: JobPlan) -> int | None:
    """The inputs' rows, estimated for the progress line (only when it is printed: it reads a sample)."""
    if job.config.progress_interval_seconds <= 0:
        return None
    inputs = job.inputs
    return row_estimate.estimate_rows(job.config.input_format, inputs.files, inputs.csv_skip_header_lines)


def _stage_for_remote_workers(options: PipelineOptions) -> None:
    if runner_checks.remote_workers(options):
        worker_packages.stage_snapfeed(options)


def _dry_run(job: JobPlan) -> MaterializeResult:
    """Translates only (DataflowRunner, ``runner_checks.check_dry_run``) and says what the workers would get.

    It reads and writes no marker, so a dry run against gs:// paths opens no
    connection and blocks no writer.
    """
    _stage_for_remote_workers(job.options)
    run_spec = _run_spec(job, Decision(Action.WRITE, "dry run"))
    try:
        translated = build_pipeline(job.options, job, run_spec).run()
    finally:
        if job.preprocessing.tf_transform:
            storage.delete_tree(job.tft_temp_dir(run_spec))
    image, staged = worker_packages.staged_artifacts(translated.job.proto_pipeline)
    result = _result(job.snapshot, "dry run", None, job.started)
    return dataclasses.replace(result, worker_image=image, staged=staged)


def _run_pipeline(job: JobPlan, run_spec: commit.RunSpec, remote: RemoteJob) -> None:
    """Runs the pipeline to its end; a job that runs elsewhere is handed to ``remote`` once submitted, so an
    interruption while the driver waits can cancel it."""
    try:
        pipeline = build_pipeline(job.options, job, run_spec)
        with ProgressReporter(
            job.snapshot.run_dir(run_spec.run_id),
            job.config.progress_interval_seconds,
            expected_rows=_expected_rows(job),
        ):
            result = pipeline.run()
            remote.submitted(result)
            state = result.wait_until_finish()
    finally:
        if job.preprocessing.tf_transform:
            storage.delete_tree(job.tft_temp_dir(run_spec))  # tf.Transform's intermediate files, kept by none
    if state is not None and state != PipelineState.DONE:
        raise SnapfeedError(f"the pipeline ended in state {state}")


def _record_failure(run_spec: commit.RunSpec, error: SnapfeedError) -> None:
    """Marks the run failed (a rerun takes over at once) and removes its shards.

    After an ``IncompleteRunError`` the shards stay: they are the evidence of
    what the runner lost, and gc removes them with the failed snapshot.
    """
    commit.mark_failed(run_spec, str(error))
    if not isinstance(error, IncompleteRunError):
        storage.delete_tree(run_spec.paths.run_dir(run_spec.run_id))


def _record_interruption(run_spec: commit.RunSpec, signals: Signals, remote: RemoteJob) -> RunInterruptedError:
    """Marks the run failed first (so a job still running elsewhere cannot commit it), then cancels that job."""
    marked = f"interrupted by {signals.name}: run {run_spec.run_id} of {run_spec.paths.directory} is marked failed"
    commit.mark_failed(run_spec, marked)
    cancelled = remote.cancel()
    error = RunInterruptedError(
        f"{marked} and committed nothing; {cancelled + '; ' if cancelled else ''}rerun the job to start over.",
        signal_number=signals.received,
    )
    _record_failure(run_spec, error)
    return error


def _same_fingerprint(job: JobPlan, manifest: Manifest | None) -> Manifest | None:
    """The finalized ``manifest`` this job may reuse, or one line naming what differs and how to rewrite.

    A fingerprint directory differs with every input, function and parameter,
    but a ``--snapshot_name`` directory does not (the RFC lets a name replace the
    fingerprint), so a rerun with a shrunken input or other parameters finds the
    old run there: its recorded fingerprint is compared, never trusted by name.
    Manifests written before fingerprints were recorded have none to compare.
    """
    if manifest is None or not manifest.fingerprint or manifest.fingerprint == job.fingerprint:
        return manifest
    changes = explain_difference(manifest.fingerprint_components, job.components) or ["the fingerprint"]
    raise UsageError(
        f"{job.snapshot.directory} holds run {manifest.run_id} of another job than this one "
        f"({'; '.join(changes)}): it was not reused. Rerun with --mode=write to replace it, or give another "
        f"--snapshot_name"
    )


def _after_lost_race(job: JobPlan) -> tuple[MaterializeResult, Manifest | None]:
    """Another run took the snapshot over while we wrote: report (or wait for) the winner."""
    config, snapshot, started = job.config, job.snapshot, job.started
    decision = _decide_until_writable(config, snapshot, lost_race=True)
    if decision.action is Action.READ:
        manifest = _same_fingerprint(job, metadata.read_manifest(snapshot))
        return _result(snapshot, "reused", manifest, started), manifest
    if decision.action is Action.PASSTHROUGH:
        return _result(snapshot, decision.reason, None, started), None
    raise SnapfeedError(
        f"this run lost the race for {snapshot.directory} to another writer, which did not commit "
        f"({decision.reason}). Rerun the job."
    )


def _add_to_view(job: JobPlan, result: MaterializeResult, manifest: Manifest) -> MaterializeResult:
    """Adds the committed run ``manifest`` to ``--view`` as its new version (``schemas.views.add``: none when the
    latest version lists the run already, so a rerun of the day adds nothing twice).

    It runs only once the snapshot is committed: a view that cannot be written
    costs the version, never the snapshot, and the error says how to add it.
    """
    view, keep = job.config.view, job.config.view_keep
    attach = None
    if job.preprocessing.window:

        def attach(number: int, members: tuple[views.Member, ...]) -> dict:
            return tft_window.window_graph(
                job.preprocessing.fn, job.config.tft_preprocessing_fn, job.inputs.raw_schema, view, number, members
            )

    try:
        version, added = views.add(view, job.snapshot, manifest, keep=keep, attach=attach)
    except (OSError, SnapfeedError) as exc:
        keep_flag = f" --keep={keep}" if keep is not None else ""
        raise SnapfeedError(
            f"{job.snapshot.directory} is committed (state={result.state}, run {manifest.run_id}, "
            f"{manifest.num_rows} rows) but could not be added to the view {view}: {str(exc).rstrip('.')}. "
            f"The snapshot is safe: make {view} writable and rerun the job (it reuses the snapshot and adds it), "
            f"or run `snapfeed view add {view} {job.snapshot.directory}{keep_flag}`"
        ) from exc
    analysis = None
    if job.preprocessing.window:
        analysis = tft_window.read_analysis_record(job.snapshot.run_dir(manifest.run_id))
    return dataclasses.replace(result, view_version=version, view_added=added, tft_analysis=analysis)


def main(argv: list[str] | None = None) -> int:
    """The command line: one summary line on stdout, or one ``error:`` line on stderr (``schemas.command``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with command.quiet_first_import("tensorflow", argv):  # TensorFlow's C++ start-up lines are not ours to print
        code = command.run("materialize", lambda: _materialize(argv), argv)
    if code > 128 and any(
        t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()
    ):
        # Stopped by a signal: the run is marked failed, and the runner's worker threads may be inside a
        # user function for minutes more. Exiting normally would wait for them; nothing is left to save.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _materialize(argv: list[str]) -> int:
    job = plan(argv)
    if job.config.print_fingerprint:
        print(job.fingerprint_json())
        return EXIT_OK
    result = execute(job)
    if result.in_progress:
        print(
            "another writer holds this snapshot: rerun with --wait to wait for it, or take it over "
            "after --pending_snapshot_expiry_seconds.",
            file=sys.stderr,
        )
    if result.state == "dry run":
        print(f"dry run: workers run {result.worker_image} and install {', '.join(result.staged)}", file=sys.stderr)
    if result.view_version is not None:
        line = views.describe_add(result.view_version, result.view_added, result.path, result.run_id, result.rows)
        print(line, file=sys.stderr)
        if result.view_added and result.view_version.transform_graph:
            print(tft_window.describe(result.view_version, result.tft_analysis), file=sys.stderr)
    print(result.summary())
    return EXIT_IN_PROGRESS if result.in_progress else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
