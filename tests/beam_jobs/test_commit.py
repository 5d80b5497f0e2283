"""The commit protocol directly: no Beam, real files."""

import pyarrow as pa

from beam_jobs import commit
from beam_jobs.commit import RunSpec, WrittenShard
from schemas import metadata
from schemas.errors import SchemaMismatchError
from schemas.snapshot_pb2 import RunState

SCHEMA = pa.schema([("id", pa.int64())])


def _run(tmp_path, run_id: str, supersedes: str = "") -> RunSpec:
    return RunSpec(root=str(tmp_path), snapshot_id="snap", run_id=run_id, supersedes_run_id=supersedes)


def _shard(run: RunSpec, name: str, rows: int = 5, schema: pa.Schema = SCHEMA) -> WrittenShard:
    path = run.paths.shard(run.run_id, name)
    import pathlib

    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_bytes(b"x" * rows)
    return WrittenShard(path, rows, rows, (rows,), 123, schema.serialize().to_pybytes())


def test_single_writer_commits_and_removes_unlisted_files(tmp_path):
    run = _run(tmp_path, "run-000000000001")
    commit.begin_run(run)
    listed = _shard(run, "shard-a-00000.arrow")
    _shard(run, "shard-retried-00000.arrow")  # a retried bundle's output: not reported
    (tmp_path / "snap" / run.run_id / ".tmp-x-shard.arrow").write_bytes(b"partial")
    outcome = commit.finalize(run, [listed], compression="lz4")
    assert outcome.committed
    manifest = metadata.read_manifest(run.paths)
    assert [s.path for s in manifest.shards] == [f"{run.run_id}/shard-a-00000.arrow"]
    assert manifest.num_rows == 5 and manifest.complete
    assert sorted(p.name for p in (tmp_path / "snap" / run.run_id).iterdir()) == ["shard-a-00000.arrow"]


def test_writer_whose_marker_was_overwritten_loses_and_cleans_up(tmp_path):
    first, second = _run(tmp_path, "run-000000000001"), _run(tmp_path, "run-000000000002")
    commit.begin_run(first)
    shard_a = _shard(first, "shard-a-00000.arrow")
    commit.begin_run(second)  # takes over the marker
    shard_b = _shard(second, "shard-b-00000.arrow")
    assert not commit.finalize(first, [shard_a], compression="lz4").committed
    assert not (tmp_path / "snap" / first.run_id).exists()
    assert commit.finalize(second, [shard_b], compression="lz4").committed
    assert metadata.read_manifest(second.paths).run_id == second.run_id


def test_check_then_write_window_is_closed_by_no_overwrite_create(tmp_path):
    """Both writers passed the marker check; only one create of metadata.final succeeds."""
    first, second = _run(tmp_path, "run-000000000001"), _run(tmp_path, "run-000000000002")
    commit.begin_run(first)
    shard_a = _shard(first, "shard-a-00000.arrow")
    assert commit.finalize(first, [shard_a], compression="lz4").committed
    # Second writer believes it owns the marker (it rewrote it) but the final exists already.
    commit.begin_run(second)
    shard_b = _shard(second, "shard-b-00000.arrow")
    outcome = commit.finalize(second, [shard_b], compression="lz4")
    assert not outcome.committed and "committed first" in outcome.reason
    assert metadata.read_manifest(first.paths).run_id == first.run_id
    assert not (tmp_path / "snap" / second.run_id).exists()


def test_finalize_is_idempotent_when_a_runner_repeats_it(tmp_path):
    run = _run(tmp_path, "run-000000000001")
    commit.begin_run(run)
    shard = _shard(run, "shard-a-00000.arrow")
    assert commit.finalize(run, [shard], compression="lz4").committed
    again = commit.finalize(run, [shard], compression="lz4")
    assert again.committed and again.reason == "already committed"
    assert (tmp_path / "snap" / run.run_id / "shard-a-00000.arrow").exists()


def test_forced_write_swaps_the_marker_and_keeps_the_old_run(tmp_path):
    old = _run(tmp_path, "run-000000000001")
    commit.begin_run(old)
    assert commit.finalize(old, [_shard(old, "shard-a-00000.arrow")], compression="lz4").committed
    new = _run(tmp_path, "run-000000000002", supersedes=old.run_id)
    commit.begin_run(new)
    outcome = commit.finalize(new, [_shard(new, "shard-b-00000.arrow")], compression="lz4")
    assert outcome.committed and "replaced" in outcome.reason
    manifest = metadata.read_manifest(new.paths)
    assert manifest.run_id == new.run_id and manifest.supersedes_run_id == old.run_id
    assert (tmp_path / "snap" / old.run_id / "shard-a-00000.arrow").exists()  # readers of the old run keep working


def test_shards_with_different_schemas_are_refused_by_name(tmp_path):
    run = _run(tmp_path, "run-000000000001")
    commit.begin_run(run)
    shards = [
        _shard(run, "shard-a-00000.arrow"),
        _shard(run, "shard-b-00000.arrow", schema=pa.schema([("id", pa.float64())])),
    ]
    try:
        commit.finalize(run, shards, compression="lz4")
    except SchemaMismatchError as exc:
        assert "shard-a-00000.arrow" in str(exc) and "shard-b-00000.arrow" in str(exc) and "int64 -> double" in str(exc)
    else:
        raise AssertionError("expected SchemaMismatchError")
    assert metadata.read_manifest(run.paths) is None


def test_mark_failed_only_touches_our_own_marker(tmp_path):
    first, second = _run(tmp_path, "run-000000000001"), _run(tmp_path, "run-000000000002")
    commit.begin_run(first)
    commit.begin_run(second)
    assert not commit.mark_failed(first, "boom")
    assert commit.mark_failed(second, "boom")
    pending = metadata.read_pending(second.paths)
    assert pending.state == RunState.FAILED and pending.error == "boom"
