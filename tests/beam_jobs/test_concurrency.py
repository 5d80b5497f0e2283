"""Concurrent writers, expiry, --wait and crashes, with real separate processes."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from beam_jobs.writing import commit
from beam_jobs.writing.commit import RunSpec
from schemas import metadata, storage
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import Manifest
from tests import helpers

ROWS = 2500  # three TFXIO batches of up to 1024 rows
BARRIER_FN = "--preprocessing_fn=tests.prep_functions:wait_for_barrier"


def barrier_args(
    raw: pathlib.Path, output: pathlib.Path, barrier: pathlib.Path, *extra: str, pass_batches: int = 0
) -> list[str]:
    params = {"dir": str(barrier), "pass_batches": pass_batches}
    return [
        f"--input={raw}/*.tfrecord",
        f"--schema={raw}/schema.pbtxt",
        f"--output={output}",
        BARRIER_FN,
        f"--preprocessing_params={json.dumps(params)}",
        "--snapshot_name=shared",
        *extra,
    ]


def wait_until(predicate, timeout: float = 120.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def raw(tmp_path):
    helpers.write_tfrecords(tmp_path / "raw", num_rows=ROWS, num_files=2)
    helpers.write_schema(tmp_path / "raw" / "schema.pbtxt")
    return tmp_path / "raw"


def started_writers(barrier: pathlib.Path) -> int:
    return len(list(barrier.glob("started-*")))


def _race(raw, tmp_path, writers: int, output: str | None = None):
    """``writers`` processes write one snapshot at once under ``output`` (a local folder, gs:// or s3://)."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    output = output or str(tmp_path / "out")
    processes = [
        helpers.start_materialize(
            *barrier_args(raw, output, barrier, "--mode=write", "--wait", "--wait_poll_seconds=0.2")
        )
        for _ in range(writers)
    ]
    # Every writer is inside its pipeline (marker written, shards being produced) before any may finish.
    wait_until(lambda: started_writers(barrier) >= writers, what=f"{writers} writers to start")
    (barrier / "go").touch()
    results = [p.communicate(timeout=300) for p in processes]
    assert [p.returncode for p in processes] == [0] * writers, [r[1][-2000:] for r in results]
    # Losers that finish before the winner commits wait for it (--wait) and report its snapshot.
    states = sorted(helpers.summary_fields(out)["state"] for out, _ in results)
    assert states == ["reused"] * (writers - 1) + ["written"]
    snapshot = SnapshotPaths(output, "shared")
    listing = storage.list_dir(snapshot.directory, include_temp=True)
    assert [e.name for e in listing if not e.is_dir] == ["metadata.final", "snapshot.metadata"]
    manifest = metadata.read_manifest(snapshot)
    assert [e.name for e in listing if e.is_dir] == [manifest.run_id], "losers' run directories must be gone"
    assert manifest.num_rows == ROWS
    assert sum(helpers.snapshot_rows(output, "shared").values()) == ROWS
    return manifest


def test_two_concurrent_writers_one_commit(raw, tmp_path):
    _race(raw, tmp_path, writers=2)


def test_four_concurrent_writers_one_commit(raw, tmp_path):
    _race(raw, tmp_path, writers=4)


def test_concurrent_writers_on_an_object_store_commit_once_and_losers_clean_up(raw, tmp_path, object_store):
    """Conditional writes (GCS generation match, S3 If-None-Match) let one of three processes commit."""
    _race(raw, tmp_path, writers=3, output=f"{object_store.root}/snapshots")


def _pending_marker(output: pathlib.Path, snapshot_id: str, start_time: float) -> RunSpec:
    run = RunSpec(root=str(output), snapshot_id=snapshot_id, run_id="run-0000deadbeef0000")
    commit.begin_run(run, now=start_time)
    return run


def test_fresh_pending_snapshot_exits_3_naming_the_writer(raw, tmp_path):
    output = tmp_path / "out"
    _pending_marker(output, "shared", time.time())
    completed = helpers.run_materialize(f"--input={raw}/*.tfrecord", f"--output={output}", "--snapshot_name=shared")
    assert completed.returncode == 3
    fields = helpers.summary_fields(completed.stdout)
    assert fields["state"].startswith("in progress by run run-0000deadbeef0000 since ")
    assert "--wait" in completed.stderr
    assert helpers.final_marker_count(output) == 0


def test_expired_pending_snapshot_is_taken_over(raw, tmp_path):
    output = tmp_path / "out"
    _pending_marker(output, "shared", time.time() - 3600)
    completed = helpers.run_materialize(
        f"--input={raw}/*.tfrecord",
        f"--output={output}",
        "--snapshot_name=shared",
        "--pending_snapshot_expiry_seconds=60",
    )
    assert completed.returncode == 0, completed.stderr
    assert helpers.summary_fields(completed.stdout)["state"] == "written"
    assert metadata.read_manifest(SnapshotPaths(str(output), "shared")).run_id != "run-0000deadbeef0000"


def test_wait_reuses_what_the_other_writer_commits(raw, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    output = tmp_path / "out"
    writer = helpers.start_materialize(*barrier_args(raw, output, barrier))
    wait_until(lambda: started_writers(barrier) >= 1, what="the first writer")
    waiter = helpers.start_materialize(*barrier_args(raw, output, barrier, "--wait", "--wait_poll_seconds=0.2"))
    time.sleep(3)
    assert waiter.poll() is None, "the waiter must wait, not fail or write"
    (barrier / "go").touch()
    writer_out, _ = writer.communicate(timeout=300)
    waiter_out, waiter_err = waiter.communicate(timeout=300)
    assert writer.returncode == 0 and waiter.returncode == 0, waiter_err[-2000:]
    assert helpers.summary_fields(writer_out)["state"] == "written"
    assert helpers.summary_fields(waiter_out)["state"] == "reused"
    assert started_writers(barrier) == 1, "the waiter never ran its own pipeline"


def test_kill_9_mid_write_leaves_no_final_and_a_rerun_completes(raw, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    output = tmp_path / "out"
    small = ("--block_size_bytes=200", "--shard_size_bytes=2000")  # a shard every few blocks
    victim = helpers.start_materialize(*barrier_args(raw, output, barrier, *small, pass_batches=1))
    wait_until(lambda: started_writers(barrier) >= 1, what="the writer to be mid-pipeline")
    pending = metadata.read_pending(SnapshotPaths(str(output), "shared"))
    run_dir = output / "shared" / pending.run_id
    # The batch let through fills a 2000-byte shard or more, renamed into place a moment after the barrier.
    wait_until(lambda: list(run_dir.glob("shard-*.arrow")), what="a shard committed before the kill")
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=60)
    assert helpers.final_marker_count(output) == 0

    # The killed writer was on this host and its process is gone: taken over at once, within the expiry.
    (barrier / "go").touch()
    rerun = helpers.run_materialize(*barrier_args(raw, output, barrier, *small))
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    manifest = metadata.read_manifest(SnapshotPaths(str(output), "shared"))
    assert manifest.run_id != pending.run_id and manifest.num_rows == ROWS
    assert all(s.path.startswith(manifest.run_id + "/") for s in manifest.shards), "no file of the killed run is listed"
    assert not any(".tmp-" in s.path for s in manifest.shards)
    assert sum(helpers.snapshot_rows(output, "shared").values()) == ROWS


def test_kill_9_then_forced_write_completes(raw, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    output = tmp_path / "out"
    victim = helpers.start_materialize(*barrier_args(raw, output, barrier))
    wait_until(lambda: started_writers(barrier) >= 1, what="the writer to be mid-pipeline")
    os.killpg(victim.pid, signal.SIGKILL)
    victim.communicate(timeout=60)
    (barrier / "go").touch()
    rerun = helpers.run_materialize(*barrier_args(raw, output, barrier, "--mode=write"))
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert helpers.summary_fields(rerun.stdout)["state"] == "written"
    assert sum(helpers.snapshot_rows(output, "shared").values()) == ROWS


def start_pausing_materialize(pause_dir: pathlib.Path, *args: str) -> subprocess.Popen:
    """A materialize job that pauses inside finalize, after its ownership check (see pausing_materialize)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.beam_jobs.pausing_materialize", str(pause_dir), "--progress_interval_seconds=0"]
        + list(args),
        cwd=helpers.REPO_ROOT,
        env=helpers.cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finalizing_writers(pause_dir: pathlib.Path) -> int:
    return len(list(pause_dir.glob("finalizing-*")))


def _finalized_shared(raw: pathlib.Path, output: pathlib.Path) -> str:
    """A finalized snapshot "shared" for forced writers to supersede; returns its run id."""
    seeded = helpers.run_materialize(f"--input={raw}/*.tfrecord", f"--output={output}", "--snapshot_name=shared")
    assert seeded.returncode == 0, seeded.stderr[-2000:]
    return metadata.read_manifest(SnapshotPaths(str(output), "shared")).run_id


def _assert_one_forced_commit(output: pathlib.Path, superseded: str) -> Manifest:
    """One metadata.final naming the winner, which supersedes the old run; only their run directories remain."""
    snapshot = SnapshotPaths(str(output), "shared")
    manifest = metadata.read_manifest(snapshot)
    assert helpers.final_marker_count(output) == 1
    assert manifest.supersedes_run_id == superseded and manifest.num_rows == ROWS
    assert metadata.read_pending(snapshot).run_id == manifest.run_id
    run_dirs = sorted(p.name for p in (output / "shared").iterdir() if p.is_dir())
    assert run_dirs == sorted([superseded, manifest.run_id]), "the loser's run directory must be gone"
    assert sum(helpers.snapshot_rows(output, "shared").values()) == ROWS
    return manifest


def test_forced_writer_that_passed_its_checks_loses_to_one_that_committed_meanwhile(raw, tmp_path):
    """Two --mode=write runs over one finalized snapshot: A has checked it owns the
    snapshot and is about to swap metadata.final when B runs its whole job and
    swaps first. A must lose like a non-forced loser (exit 0, "reused", its run
    directory deleted) instead of overwriting B's commit and orphaning B's run."""
    output, pause = tmp_path / "out", tmp_path / "pause"
    pause.mkdir()
    superseded = _finalized_shared(raw, output)
    forced = (f"--input={raw}/*.tfrecord", f"--output={output}", "--snapshot_name=shared", "--mode=write")
    first = start_pausing_materialize(pause, *forced)
    wait_until(lambda: finalizing_writers(pause) >= 1 or first.poll() is not None, what="A to reach finalize")
    assert first.poll() is None, first.communicate()[1][-2000:]
    second = helpers.run_materialize(*forced)
    assert second.returncode == 0, second.stderr[-2000:]
    assert helpers.summary_fields(second.stdout)["state"] == "written"
    (pause / "release").touch()
    first_out, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err[-2000:]
    assert helpers.summary_fields(first_out)["state"] == "reused", "A must not report a second commit"
    _assert_one_forced_commit(output, superseded)


def test_forced_loser_reports_the_winner_still_writing(raw, tmp_path):
    """Two --mode=write runs over one finalized snapshot, both inside their
    pipelines; B began last, so it owns the snapshot, and is held in finalize.
    A loses first and must say what a non-forced loser says (exit 3, "in
    progress by run B"), not "reused" for the very run B is replacing."""
    output, barrier = tmp_path / "out", tmp_path / "barrier"
    barrier.mkdir()
    superseded = _finalized_shared(raw, output)
    first = helpers.start_materialize(*barrier_args(raw, output, barrier, "--mode=write"))
    wait_until(lambda: started_writers(barrier) >= 1, what="A to start")
    second = start_pausing_materialize(barrier, *barrier_args(raw, output, barrier, "--mode=write"))
    wait_until(lambda: started_writers(barrier) >= 2, what="B to start")
    owner = metadata.read_pending(SnapshotPaths(str(output), "shared")).run_id
    (barrier / "go").touch()
    first_out, first_err = first.communicate(timeout=300)
    assert first.returncode == 3, first_err[-2000:]
    assert helpers.summary_fields(first_out)["state"].startswith(f"in progress by run {owner} since ")
    assert "--wait" in first_err
    wait_until(lambda: finalizing_writers(barrier) >= 1 or second.poll() is not None, what="B to reach finalize")
    assert second.poll() is None, "B must still be held in finalize"
    (barrier / "release").touch()
    second_out, second_err = second.communicate(timeout=300)
    assert second.returncode == 0, second_err[-2000:]
    assert helpers.summary_fields(second_out)["state"] == "written"
    assert _assert_one_forced_commit(output, superseded).run_id == owner
