"""A job submitted to a runner that runs it elsewhere outlives its driver: cancel it when the driver is stopped.

Dataflow and a portable job service (Flink's, Spark's, Prism's, Beam's own
at ``--job_endpoint``) run the pipeline in their own processes; the driver
only holds the ``PipelineResult`` that ``run()`` returned. A Ctrl-C that ends
the driver alone leaves the job running on, using the cluster for nothing
(its finalize step cannot commit: the run is marked failed, ``commit.finalize``).
So on an interruption the driver cancels it through that result and the error
line says whether that worked, and if not, how to cancel it by hand.
In-process runners (DirectRunner, Beam's embedded job service, DaskRunner's
client) stop with the driver and hold nothing to cancel.
"""

from __future__ import annotations

import dataclasses
import threading

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, PortableOptions

from beam_jobs.runners.checks import runner_name

#: How long the driver waits for the runner to accept a cancel before saying how to cancel by hand.
CANCEL_TIMEOUT_SECONDS = 30.0

_JOB_SERVICE_RUNNERS = ("portable", "flink", "spark", "prism")


def _job_service(options: PipelineOptions) -> str | None:
    """Where the job would run out of the driver's process (a phrase), or None if it runs in it."""
    name = runner_name(options)
    if name == "dataflow":
        return "Dataflow"
    if name not in _JOB_SERVICE_RUNNERS:
        return None
    endpoint = options.view_as(PortableOptions).job_endpoint
    if endpoint == "embed":
        return None
    return f"the job service at {endpoint}" if endpoint else f"the {name.capitalize()}Runner's job server"


def _how_to_cancel(options: PipelineOptions, job_id: str, where: str) -> str:
    if where == "Dataflow":
        region = options.view_as(GoogleCloudOptions).region or "REGION"
        return f"gcloud dataflow jobs cancel {job_id} --region={region}"
    return f"cancel job {job_id} in {where}'s UI (Flink's dashboard, Spark's UI) or its Cancel call"


@dataclasses.dataclass
class RemoteJob:
    """The submitted job of a runner that runs it elsewhere (``result`` None until ``submitted``)."""

    options: PipelineOptions
    where: str | None = None
    result: object = None

    @classmethod
    def for_options(cls, options: PipelineOptions) -> RemoteJob:
        return cls(options, _job_service(options))

    def submitted(self, result) -> None:
        """Holds ``result`` (what ``pipeline.run()`` returned) if the job runs elsewhere."""
        if self.where is not None:
            self.result = result

    @property
    def job_id(self) -> str:
        job_id = getattr(self.result, "job_id", None)  # DataflowPipelineResult
        if callable(job_id):
            return str(job_id())
        return str(getattr(self.result, "_job_id", "?"))  # portable_runner.PipelineResult keeps it private

    def cancel(self) -> str:
        """Cancels the job; returns the error line's sentence about it ("" when no job runs elsewhere).

        The cancel call runs on a daemon thread the driver waits for at most
        ``CANCEL_TIMEOUT_SECONDS``: a runner that does not answer must not keep
        an interrupted driver alive.
        """
        if self.result is None:
            return ""
        outcome: list[BaseException | None] = []

        def cancel() -> None:
            try:
                self.result.cancel()
                outcome.append(None)
            except Exception as exc:  # noqa: BLE001 - any failure is reported with the way to cancel by hand
                outcome.append(exc)

        worker = threading.Thread(target=cancel, name="cancel-remote-job", daemon=True)
        worker.start()
        worker.join(CANCEL_TIMEOUT_SECONDS)
        job_id = self.job_id
        if outcome == [None]:
            return f"the remote job {job_id} was cancelled on {self.where}"
        cause = (
            f"{type(outcome[0]).__name__}: {str(outcome[0]).splitlines()[0] if str(outcome[0]) else ''}"
            if outcome
            else f"no answer in {CANCEL_TIMEOUT_SECONDS:.0f} s"
        )
        return (
            f"cancelling the remote job {job_id} on {self.where} failed ({cause}): cancel it by hand "
            f"({_how_to_cancel(self.options, job_id, self.where)})"
        )
