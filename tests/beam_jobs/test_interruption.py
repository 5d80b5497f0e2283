"""Ctrl-C, SIGTERM and kill -9 during materialize: one line, the run marked, and the rerun never blocked.

Signals are sent from Python to a real job process (a shell's ``cmd &`` would
ignore SIGINT). The job is held inside its preprocessing function by a
barrier file, so the signal always lands while the pipeline runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from reader.snapshots import inventory
from schemas import metadata
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import RunState
from tests import helpers


def _job_args(tfrecord_input, root: pathlib.Path, barrier: pathlib.Path, *extra: str, pass_batches: int = 0):
    params = {"dir": str(barrier), "timeout": 600, "pass_batches": pass_batches}
    return [
        f"--input={tfrecord_input['pattern']}",
        f"--schema={tfrecord_input['schema']}",
        f"--output={root}",
        "--preprocessing_fn=tests.prep_functions:wait_for_barrier",
        f"--preprocessing_params={json.dumps(params)}",
        *extra,
    ]


def _start_held(args: list[str], barrier: pathlib.Path) -> subprocess.Popen:
    barrier.mkdir(exist_ok=True)
    job = helpers.start_materialize(*args)
    deadline = time.monotonic() + 180
    while not list(barrier.glob("started-*")):
        if job.poll() is not None:
            pytest.fail(f"the job ended before reaching the barrier: {job.communicate()}")
        if time.monotonic() > deadline:
            job.kill()
            pytest.fail("the job never reached its preprocessing function")
        time.sleep(0.1)
    return job


def _the_snapshot(root: pathlib.Path) -> SnapshotPaths:
    (directory,) = [p for p in root.iterdir() if p.is_dir()]
    return SnapshotPaths(str(root), directory.name)


def _snapfeed(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reader.snapshots", *args],
        cwd=helpers.REPO_ROOT,
        env=helpers.cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("sig", "name", "mode"),
    [
        (signal.SIGINT, "SIGINT", "in_memory"),  # the default: DoFns run in the main thread, which gets the signal
        (signal.SIGTERM, "SIGTERM", "in_memory"),
        (signal.SIGINT, "SIGINT", "multi_threading"),  # DoFns on worker threads the exit must not wait for
    ],
)
def test_a_signal_marks_the_run_failed_with_one_line_and_the_rerun_writes(tfrecord_input, tmp_path, sig, name, mode):
    root, barrier = tmp_path / "out", tmp_path / "barrier"
    args = _job_args(tfrecord_input, root, barrier, f"--direct_running_mode={mode}")
    job = _start_held(args, barrier)
    job.send_signal(sig)
    stdout, stderr = job.communicate(timeout=120)
    assert job.returncode == 128 + sig, stderr
    lines = stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: interrupted by {name}: run run-"), stderr
    assert "Traceback" not in stderr and len(lines) < 10, stderr
    snapshot = _the_snapshot(root)
    pending = metadata.read_pending(snapshot)
    assert pending.state == RunState.FAILED and f"interrupted by {name}" in pending.error
    assert not (pathlib.Path(snapshot.directory) / pending.run_id).exists(), "its shards are removed"
    assert "failed" in _snapfeed("list", str(root)).stdout

    (barrier / "go").touch()
    rerun = helpers.run_materialize(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert helpers.summary_fields(rerun.stdout)["state"] == "written"
    assert metadata.read_manifest(snapshot).num_rows == 3000


def test_after_kill_9_the_rerun_takes_over_at_once(tfrecord_input, tmp_path):
    """The pending marker names a dead process on this host: abandoned, not "another writer" for 24 hours."""
    root, barrier = tmp_path / "out", tmp_path / "barrier"
    # Two batches pass before the barrier, so the killed run leaves shards behind.
    args = _job_args(
        tfrecord_input, root, barrier, "--shard_size_bytes=2000", "--block_size_bytes=1000", pass_batches=2
    )
    job = _start_held(args, barrier)
    os.killpg(job.pid, signal.SIGKILL)
    job.communicate(timeout=60)
    snapshot = _the_snapshot(root)
    killed = metadata.read_pending(snapshot)
    assert killed.state == RunState.PENDING and killed.writer.pid == job.pid
    assert list((pathlib.Path(snapshot.directory) / killed.run_id).glob("shard-*"))

    listed = json.loads(_snapfeed("list", str(root), "--json").stdout)
    assert [entry["state"] for entry in listed] == [inventory.ABANDONED]
    planned = _snapfeed("gc", str(root), "--older-than=0s", "--dry-run")
    assert f"would remove {snapshot.directory} (snapshot {snapshot.snapshot_id} is abandoned" in planned.stdout

    (barrier / "go").touch()
    rerun = helpers.run_materialize(*args)  # the default expiry (24 h) is in force
    assert rerun.returncode == 0, rerun.stderr
    assert helpers.summary_fields(rerun.stdout)["state"] == "written"
    assert metadata.read_manifest(snapshot).run_id != killed.run_id
    assert _snapfeed("gc", str(root), "--older-than=0s").returncode == 0
    assert not (pathlib.Path(snapshot.directory) / killed.run_id).exists(), "the killed run's files are collected"


def test_gc_says_why_it_leaves_a_live_writers_snapshot(tfrecord_input, tmp_path):
    root, barrier = tmp_path / "out", tmp_path / "barrier"
    job = _start_held(_job_args(tfrecord_input, root, barrier), barrier)
    try:
        collected = _snapfeed("gc", str(root), "--older-than=0s")
        assert collected.returncode == 0
        assert "alone: pending, run run-" in collected.stdout and f"(pid {job.pid})" in collected.stdout
        assert "removed 0 item(s)" in collected.stdout
    finally:
        (barrier / "go").touch()
        job.communicate(timeout=300)
    assert job.returncode == 0


def _remote_jobs(endpoint: str) -> list:
    """The jobs the job service at ``endpoint`` knows, with their states."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    with grpc.insecure_channel(endpoint) as channel:
        return list(beam_job_api_pb2_grpc.JobServiceStub(channel).GetJobs(beam_job_api_pb2.GetJobsRequest()).job_info)


@pytest.mark.slow
def test_ctrl_c_cancels_the_job_submitted_to_a_job_service_and_nothing_commits(tfrecord_input, tmp_path):
    """The job runs in a job service's process (as on Flink, Spark or Dataflow), not the driver's: the driver
    cancels it, says so, and the job's finalize, if the service lets it reach that far, commits nothing."""
    from apache_beam.portability.api import beam_job_api_pb2

    from testing import engines

    root, barrier = tmp_path / "out", tmp_path / "barrier"
    with engines.job_service() as endpoint, engines.worker_pool() as pool:
        job = _start_held(_job_args(tfrecord_input, root, barrier, *engines.portable_flags(pool, endpoint)), barrier)
        job.send_signal(signal.SIGINT)
        _, stderr = job.communicate(timeout=120)
        assert job.returncode == 128 + signal.SIGINT, stderr
        (remote,) = _remote_jobs(endpoint)
        assert stderr.strip().splitlines()[-1].startswith("error: interrupted by SIGINT: run run-"), stderr
        assert f"the remote job {remote.job_id} was cancelled" in stderr, stderr
        assert remote.state == beam_job_api_pb2.JobState.CANCELLED
        # Beam's Python job service marks the job cancelled but lets its bundles run on (its state turns DONE
        # when they end): released, the held bundle reaches the finalize step, which must not commit a run
        # the driver marked failed.
        (barrier / "go").touch()
        deadline = time.monotonic() + 120
        while _remote_jobs(endpoint)[0].state == beam_job_api_pb2.JobState.CANCELLED:
            assert time.monotonic() < deadline, "the cancelled job's bundles never ended"
            time.sleep(0.2)
        snapshot = _the_snapshot(root)
        assert metadata.read_manifest(snapshot) is None, "the cancelled run committed"
        pending = metadata.read_pending(snapshot)
        assert pending.state == RunState.FAILED
        assert not (pathlib.Path(snapshot.directory) / pending.run_id).exists(), "its finalize removed its shards"
