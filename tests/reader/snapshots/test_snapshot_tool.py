"""`snapfeed list|show|verify|explain|gc` on real snapshots written by the materialize job."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from beam_jobs import materialize
from beam_jobs.writing import commit
from reader.snapshots import main
from tests import helpers

PARAMS = '--preprocessing_params={"scale": 2}'


def job_flags(tfrecord_input, *extra):
    return [
        f"--input={tfrecord_input['pattern']}",
        f"--schema={tfrecord_input['schema']}",
        "--preprocessing_fn=tests.prep_functions:normalize",
        "--progress_interval_seconds=0",
        "--block_size_bytes=8192",
        "--shard_size_bytes=40000",
        *extra,
    ]


@pytest.fixture(scope="module")
def job_root(tfrecord_input, tmp_path_factory):
    """Two finalized snapshots differing only in params, written by the real job."""
    root = tmp_path_factory.mktemp("tool")
    first = materialize.run([*job_flags(tfrecord_input, PARAMS), f"--output={root}"])
    second = materialize.run([*job_flags(tfrecord_input, '--preprocessing_params={"scale": 3}'), f"--output={root}"])
    assert first.state == second.state == "written"
    return {"root": root, "a": first.snapshot_id, "b": second.snapshot_id}


@pytest.fixture
def root_copy(job_root, tmp_path):
    target = tmp_path / "root"
    shutil.copytree(job_root["root"], target)
    return target


def run_tool(capsys, *argv):
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def shard_of(root, snapshot_id):
    return sorted((root / snapshot_id).glob("run-*/shard-*.arrow"))[0]


def test_list_shows_every_state(root_copy, capsys, job_root):
    pending = commit.RunSpec(root=str(root_copy), snapshot_id="pending-one", run_id=commit.new_run_id())
    commit.begin_run(pending)
    expired = commit.RunSpec(root=str(root_copy), snapshot_id="expired-one", run_id=commit.new_run_id())
    commit.begin_run(expired, now=1_000_000.0)
    failed = commit.RunSpec(root=str(root_copy), snapshot_id="failed-one", run_id=commit.new_run_id())
    commit.begin_run(failed)
    commit.mark_failed(failed, "preprocessing_fn raised")
    abandoned = commit.RunSpec(root=str(root_copy), snapshot_id="abandoned-one", run_id=commit.new_run_id())
    commit.begin_run(abandoned)
    (root_copy / "abandoned-one" / "snapshot.metadata").unlink()  # markers gone, run directory left
    shutil.copytree(next((root_copy / job_root["a"]).glob("run-*")), root_copy / "abandoned-one" / abandoned.run_id)
    (root_copy / "notes").mkdir()
    (root_copy / "notes" / "todo.txt").write_text("not a snapshot")
    code, out, _ = run_tool(capsys, "list", root_copy, "--json")
    states = {row["id"]: row["state"] for row in json.loads(out)}
    assert code == 0
    assert states == {
        job_root["a"]: "final",
        job_root["b"]: "final",
        "pending-one": "pending",
        "expired-one": "expired pending",
        "failed-one": "failed",
        "abandoned-one": "abandoned",
        "notes": "unknown",
    }
    code, text, _ = run_tool(capsys, "list", root_copy)
    assert "STATE" in text and "expired pending" in text and "auto" in text and "unknown (not snapfeed's)" in text
    code, text, _ = run_tool(capsys, "gc", root_copy, "--dry-run")
    assert "would remove 0 item(s)" in text, "everything is inside the grace period or not snapfeed's"


def test_show_prints_schema_shapes_fingerprint_and_writer(job_root, capsys):
    code, text, _ = run_tool(capsys, "show", job_root["root"] / job_root["a"])
    assert code == 0
    assert "grid: float32[2, 4]" in text and "tests.prep_functions:normalize" in text
    assert '{"scale":2}' in text and "writer: snapfeed" in text
    assert re.search(r"codec: auto \(lz4: \d+ shards\)", text), "AUTO chose LZ4 for these compressible rows"
    code, out, _ = run_tool(capsys, "show", job_root["root"] / job_root["a"], "--json")
    assert json.loads(out)["metadata"]["fingerprint"] == job_root["a"]


def test_verify_passes_a_good_snapshot_and_names_every_bad_shard(root_copy, job_root, capsys):
    snapshot = root_copy / job_root["a"]
    assert run_tool(capsys, "verify", snapshot)[0] == 0
    shards = sorted(snapshot.glob("run-*/shard-*.arrow"))
    assert len(shards) >= 3
    data = bytearray(shards[0].read_bytes())
    data[len(data) // 2] ^= 0x01
    shards[0].write_bytes(bytes(data))
    shards[1].write_bytes(shards[1].read_bytes()[:-10])
    shards[2].unlink()
    code, out, _ = run_tool(capsys, "verify", snapshot, "--json")
    report = json.loads(out)
    assert code == 1 and len(report["bad"]) == 3
    text = "\n".join(report["bad"])
    assert re.search(rf"{shards[0].name}: (block \d+ )?CRC32C", text)  # the bad block named where blocks have CRCs
    assert f"{shards[1].name}: " in text and "truncated" in text
    assert f"{shards[2].name}: missing" in text
    code, out, _ = run_tool(capsys, "verify", snapshot, "--sample=0.01", "--json")
    assert json.loads(out)["checked"] == 1


def test_verify_of_a_root_with_several_snapshots_is_a_usage_error(job_root, capsys):
    code, _, err = run_tool(capsys, "verify", job_root["root"])
    assert code == 2 and "snapshot_name" in err


def test_explain_names_the_changed_params(job_root, capsys):
    code, text, _ = run_tool(capsys, "explain", job_root["root"], job_root["a"], job_root["b"])
    assert code == 0 and 'preprocessing params: {"scale":2} -> {"scale":3}' in text
    code, text, _ = run_tool(capsys, "explain", job_root["root"], job_root["a"], job_root["a"])
    assert "same fingerprint components" in text


def test_explain_job_flags_plans_without_running(job_root, tfrecord_input, capsys, tmp_path):
    flags = " ".join(f"'{f}'" for f in job_flags(tfrecord_input, PARAMS))
    before = sorted(p.name for p in job_root["root"].iterdir())
    code, out, _ = run_tool(capsys, "explain", job_root["root"], "--job-flags", flags, "--json")
    assert code == 0 and json.loads(out) == {
        "snapshot_id": job_root["a"],
        "reused": True,
        "changes": [],
        "compared_with": None,
    }
    extra = tmp_path / "extra"
    helpers.write_tfrecords(extra, num_rows=10, num_files=1, start=5000)
    more = job_flags(tfrecord_input, PARAMS)
    more[0] = f"--input={tfrecord_input['pattern']},{extra}/*.tfrecord"
    code, text, _ = run_tool(capsys, "explain", job_root["root"], "--job-flags", " ".join(f"'{f}'" for f in more))
    assert "would write a new snapshot" in text and "input file added" in text and "input patterns" in text
    assert sorted(p.name for p in job_root["root"].iterdir()) == before, "explain must not write"


def test_gc_removes_lost_and_expired_runs_but_never_listed_files(root_copy, job_root, capsys):
    snapshot = root_copy / job_root["a"]
    live = next(snapshot.glob("run-*"))
    orphan = snapshot / commit.new_run_id()
    shutil.copytree(live, orphan)  # a racing writer's leftover
    expired = commit.RunSpec(root=str(root_copy), snapshot_id="expired-one", run_id=commit.new_run_id())
    commit.begin_run(expired, now=1_000_000.0)
    (root_copy / "expired-one" / expired.run_id).mkdir()
    fresh = commit.RunSpec(root=str(root_copy), snapshot_id="fresh-one", run_id=commit.new_run_id())
    commit.begin_run(fresh)

    code, text, _ = run_tool(capsys, "gc", root_copy, "--older-than=7d")
    assert code == 0 and orphan.exists(), "inside the grace period nothing goes"
    code, text, _ = run_tool(capsys, "gc", root_copy, "--older-than=0s", "--dry-run")
    assert "would remove" in text and orphan.name in text and orphan.exists()
    code, text, _ = run_tool(capsys, "gc", root_copy, "--older-than=0s")
    assert not orphan.exists() and not (root_copy / "expired-one").exists()
    assert (root_copy / "fresh-one").exists(), "a writer in progress is left alone"
    assert live.exists() and run_tool(capsys, "verify", snapshot)[0] == 0


def age(path, days: float) -> None:
    """Backdates ``path`` and everything under it, as if written ``days`` ago."""
    when = time.time() - days * 86400
    for child in [*path.rglob("*"), path]:
        os.utime(child, (when, when))


def test_gc_keeps_a_superseded_run_for_the_grace_period(root_copy, job_root, tfrecord_input, capsys):
    """The grace period starts when the forced rewrite commits, not when the old run's files were written."""
    old_run = next((root_copy / job_root["a"]).glob("run-*")).name
    age(root_copy / job_root["a"] / old_run, 30)
    forced = materialize.run([*job_flags(tfrecord_input, PARAMS), f"--output={root_copy}", "--mode=write"])
    assert forced.state == "written" and forced.run_id != old_run
    code, text, _ = run_tool(capsys, "gc", root_copy)
    assert code == 0 and f"removed {root_copy / job_root['a'] / old_run}" not in text and "removed 0 item(s)" in text
    assert f"{old_run} alone: superseded run, idle for " in text, "gc says why it keeps the run"
    assert (root_copy / job_root["a"] / old_run).exists()
    run_tool(capsys, "gc", root_copy, "--older-than=1h")
    assert (root_copy / job_root["a"] / old_run).exists()
    code, text, _ = run_tool(capsys, "gc", root_copy, "--older-than=0s")
    assert "superseded" in text and not (root_copy / job_root["a"] / old_run).exists()
    assert run_tool(capsys, "verify", root_copy / job_root["a"])[0] == 0


def test_console_entry_point_and_bad_durations(job_root):
    completed = subprocess.run(
        [sys.executable, "-m", "reader.snapshots", "gc", str(job_root["root"]), "--older-than=soon"],
        capture_output=True,
        text=True,
        env={**helpers.cli_env(), **{"PYTHONHASHSEED": "0"}},
        check=False,
    )
    assert completed.returncode == 2 and "--older-than='soon'" in completed.stderr
    assert os.path.exists(job_root["root"])
