"""WriteSnapshot at the end of a user's own Beam pipeline (TestPipeline + assert_that)."""

import traceback

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that

from beam_jobs import WriteSnapshot
from schemas import columns, metadata
from schemas.errors import SchemaMismatchError, UsageError
from schemas.paths import SnapshotPaths
from tests import helpers


def make_batch(start: int) -> object:
    ids = np.arange(start, start + 100)
    return columns.record_batch_from_arrays(
        {"id": ids, "image": np.zeros((100, 4, 4, 3), np.uint8) + (ids % 255)[:, None, None, None].astype(np.uint8)}
    )


def committed(outcomes):
    (outcome,) = outcomes
    if not outcome.committed or outcome.manifest.num_rows != 1000:
        raise AssertionError(f"unexpected outcome {outcome}")


def test_standalone_write_snapshot_commits_a_named_snapshot(tmp_path):
    transform = WriteSnapshot(
        str(tmp_path),
        snapshot_name="user-pipeline",
        compression="NONE",
        block_size_bytes=20_000,
        shard_size_bytes=30_000,
    )
    with TestPipeline() as pipeline:
        outcomes = pipeline | beam.Create(range(0, 1000, 100)) | beam.Map(make_batch) | transform
        assert_that(outcomes, committed)
    snapshot = SnapshotPaths(str(tmp_path), "user-pipeline")
    manifest = metadata.read_manifest(snapshot)
    assert manifest.snapshot_name == "user-pipeline" and manifest.run_id == transform.run.run_id
    assert [list(c.shape) for c in manifest.columns] == [[], [4, 4, 3]]
    rows = helpers.snapshot_rows(tmp_path, "user-pipeline")
    assert len(rows) == 1000 and len(manifest.shards) > 1
    assert metadata.read_pending(snapshot).run_id == transform.run.run_id


def test_batches_with_different_schemas_fail_without_commit(tmp_path):
    def mixed(start):
        batch = make_batch(start)
        return batch if start == 0 else batch.drop_columns(["image"])

    with pytest.raises(Exception, match="feeding WriteSnapshot changed its output schema between batches"):
        with TestPipeline() as pipeline:
            _ = pipeline | beam.Create([0, 100]) | beam.Map(mixed) | WriteSnapshot(str(tmp_path), snapshot_name="mixed")
    assert helpers.final_marker_count(tmp_path) == 0


def test_write_snapshot_needs_a_name_or_run():
    with pytest.raises(UsageError, match="snapshot_name"):
        WriteSnapshot("/tmp/x")
    with pytest.raises(UsageError, match="snapshot_name"):
        WriteSnapshot("/tmp/x", snapshot_name="../escape")


def test_schema_mismatch_error_type_is_preserved_by_recovery():
    from beam_jobs.failures import recover_snapfeed_error

    raised = SchemaMismatchError("the pipeline feeding WriteSnapshot changed its output schema between batches")
    relayed = RuntimeError("".join(traceback.format_exception(raised)))  # as the Fn API hands it to the driver
    error = recover_snapfeed_error(relayed)
    assert isinstance(error, SchemaMismatchError) and str(error) == str(raised)


def outcome_is(committed: bool, reason: str):
    def check(outcomes):
        (outcome,) = outcomes
        if outcome.committed != committed or outcome.reason != reason:
            raise AssertionError(f"expected committed={committed} reason={reason!r}, got {outcome}")

    return check


def _write_ids(root, start: int, reason: str) -> WriteSnapshot:
    """Writes ids start..start+199 to the snapshot "daily" with a standalone WriteSnapshot."""
    transform = WriteSnapshot(str(root), snapshot_name="daily")
    with TestPipeline() as pipeline:
        outcomes = pipeline | beam.Create([start, start + 100]) | beam.Map(make_batch) | transform
        assert_that(outcomes, outcome_is(True, reason))
    return transform


def test_standalone_write_snapshot_over_a_finalized_snapshot_supersedes_it_like_mode_write(tmp_path):
    """A pipeline that rewrites its named snapshot every day must replace it, not silently do nothing."""
    first = _write_ids(tmp_path, 0, "committed")
    second = _write_ids(tmp_path, 5000, f"replaced run {first.run.run_id}")
    snapshot = SnapshotPaths(str(tmp_path), "daily")
    manifest = metadata.read_manifest(snapshot)
    assert manifest.run_id == second.run.run_id and manifest.supersedes_run_id == first.run.run_id
    assert metadata.read_pending(snapshot).run_id == second.run.run_id
    ids = sorted(int(np.frombuffer(dict(key)["id"], np.int64)[0]) for key in helpers.snapshot_rows(tmp_path, "daily"))
    assert ids == list(range(5000, 5200)), "the snapshot holds the new run's rows"
    assert (tmp_path / "daily" / first.run.run_id).is_dir(), "the old run stays for readers that opened it, until gc"
