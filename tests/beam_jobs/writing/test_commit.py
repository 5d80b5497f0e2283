"""The commit protocol directly: no Beam, real files."""

import concurrent.futures
import dataclasses
import pathlib
import threading

import pyarrow as pa
import pytest

from beam_jobs.writing import commit
from beam_jobs.writing.commit import RunSpec, WrittenShard
from schemas import manifests, metadata, storage
from schemas.errors import EmptySnapshotError, IncompleteRunError, SchemaMismatchError
from schemas.shard_codec import ShardStats
from schemas.snapshot_pb2 import FingerprintComponents, RunState

SCHEMA = pa.schema([("id", pa.int64())])


def _run(tmp_path, run_id: str, supersedes: str = "") -> RunSpec:
    return RunSpec(root=str(tmp_path), snapshot_id="snap", run_id=run_id, supersedes_run_id=supersedes)


def _shard(run: RunSpec, name: str, rows: int = 5, schema: pa.Schema = SCHEMA) -> WrittenShard:
    path = run.paths.shard(run.run_id, name)
    import pathlib

    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_bytes(b"x" * rows)
    return WrittenShard(path, ShardStats(rows, rows, (rows,), 123), schema.serialize().to_pybytes())


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


def test_a_run_its_driver_marked_failed_never_commits(tmp_path):
    """A remote runner may run on after its driver was interrupted and marked the run failed."""
    run = _run(tmp_path, "run-000000000001")
    commit.begin_run(run)
    shard = _shard(run, "shard-a-00000.arrow")
    commit.mark_failed(run, "interrupted by SIGINT")
    outcome = commit.finalize(run, [shard], compression="lz4")
    assert not outcome.committed and "marked failed by its driver (interrupted by SIGINT)" in outcome.reason
    assert metadata.read_manifest(run.paths) is None
    assert not (tmp_path / "snap" / run.run_id).exists()


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


def _finalized(root, run_id: str = "run-000000000001") -> RunSpec:
    old = _run(root, run_id)
    commit.begin_run(old)
    assert commit.finalize(old, [_shard(old, "shard-old-00000.arrow")], compression="lz4").committed
    return old


def _race_after_read(root, k: int, monkeypatch) -> dict:
    """Forced writers A and B supersede one finalized run; B begins and finalizes
    right after A's k-th read of a marker file (if A reads that often)."""
    old = _finalized(root)
    a = _run(root, "run-00000000000a", supersedes=old.run_id)
    b = _run(root, "run-00000000000b", supersedes=old.run_id)
    commit.begin_run(a)
    shard_a, shard_b = _shard(a, "shard-a-00000.arrow"), _shard(b, "shard-b-00000.arrow")
    real_read, reads, outcomes = storage.read_bytes, [0], {}

    def read_bytes(path):
        data = real_read(path)
        reads[0] += 1
        if reads[0] == k:  # B's own reads count past k, so B runs once
            commit.begin_run(b)
            outcomes["b"] = commit.finalize(b, [shard_b], compression="lz4")
        return data

    with monkeypatch.context() as patch:
        patch.setattr(storage, "read_bytes", read_bytes)
        outcomes["a"] = commit.finalize(a, [shard_a], compression="lz4")
    return {"old": old, "run_a": a, "run_b": b, **outcomes}


def test_concurrent_forced_writers_superseding_one_run_commit_at_most_once(tmp_path, monkeypatch):
    """Wherever B's whole commit lands between A's reads (before or after A's checks),
    exactly one of them commits; the loser's run directory is gone, the old run stays."""
    k = 1
    while True:
        root = tmp_path / f"b-after-read-{k}"
        race = _race_after_read(root, k, monkeypatch)
        if "b" not in race:  # A finished before its k-th read: every interleaving was tried
            break
        outcome_a, outcome_b = race["a"], race["b"]
        assert [outcome_a.committed, outcome_b.committed].count(True) == 1, (k, outcome_a, outcome_b)
        winner, loser = (race["run_a"], race["run_b"]) if outcome_a.committed else (race["run_b"], race["run_a"])
        manifest = metadata.read_manifest(winner.paths)
        assert manifest.run_id == winner.run_id and manifest.supersedes_run_id == race["old"].run_id
        assert not (root / "snap" / loser.run_id).exists(), f"k={k}: the loser's run directory is orphaned"
        assert (root / "snap" / race["old"].run_id).exists(), "the superseded run stays for gc"
        assert "lost the race" in (outcome_b if outcome_a.committed else outcome_a).reason
        k += 1
    assert k > 2, "A must read the markers more than once"


def test_compare_and_swap_replaces_only_what_it_read(tmp_path):
    path = str(tmp_path / "marker")
    storage.atomic_write(path, b"old")
    assert not storage.compare_and_swap(path, b"other", b"new")
    assert storage.read_bytes(path) == b"old"
    assert storage.compare_and_swap(path, b"old", b"new")
    assert not storage.compare_and_swap(path, b"old", b"newer"), "a second swap from the same read must fail"
    assert storage.read_bytes(path) == b"new"
    assert not storage.compare_and_swap(str(tmp_path / "missing"), b"old", b"new")
    assert not (tmp_path / "missing").exists()


def test_compare_and_swap_has_one_winner_among_concurrent_threads(tmp_path):
    path = str(tmp_path / "marker")
    storage.atomic_write(path, b"old")
    start = threading.Barrier(8)

    def swap(i: int) -> bool:
        start.wait()
        return storage.compare_and_swap(path, b"old", f"writer-{i}".encode())

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        won = list(pool.map(swap, range(8)))
    assert won.count(True) == 1
    assert storage.read_bytes(path) == f"writer-{won.index(True)}".encode()
    assert [p.name for p in tmp_path.iterdir()] == ["marker"], "no temp file is left behind"


def test_finalize_refuses_rows_the_runner_did_not_report_and_keeps_the_shards(tmp_path):
    """A runner that drops the writers' finish_bundle output reports fewer rows than reached them."""
    run = _run(tmp_path, "run-000000000001")
    commit.begin_run(run)
    reported = _shard(run, "shard-a-00000.arrow", rows=5)
    unreported = _shard(run, "shard-b-00000.arrow", rows=7)
    with pytest.raises(IncompleteRunError, match="12 rows reached the shard writers .* reported 5 rows in 1"):
        commit.finalize(run, [reported], compression="none", counts=commit.RowCounts(delivered=12))
    assert metadata.read_manifest(run.paths) is None
    assert pathlib.Path(unreported.path).exists(), "never delete written shards as unlisted on a short report"


@pytest.mark.parametrize(
    ("counts", "function", "cause"),
    [
        (commit.RowCounts(delivered=0, read=0), "", "the input files hold no rows"),
        (commit.RowCounts(delivered=0, read=40), "tests.prep_functions:returns_nothing", "kept none of the 40 rows"),
        (commit.RowCounts(delivered=0), "", "no rows reached WriteSnapshot"),
    ],
)
def test_finalize_refuses_an_empty_commit_naming_the_cause(tmp_path, counts, function, cause):
    components = FingerprintComponents(function_name=function, input_patterns=["raw/*.csv"])
    run = dataclasses.replace(_run(tmp_path, "run-000000000001"), components=components.SerializeToString())
    commit.begin_run(run)
    with pytest.raises(EmptySnapshotError, match=cause):
        commit.finalize(run, [], compression="none", counts=counts)
    assert metadata.read_manifest(run.paths) is None
    outcome = commit.finalize(run, [], compression="none", counts=counts, allow_empty=True)
    assert outcome.committed and outcome.manifest.num_rows == 0
    assert manifests.arrow_schema(outcome.manifest) == pa.schema([])
