"""The default DirectRunner settings, and a job at a size that used to fail with them."""

import pathlib
import shutil

import numpy as np
import pyarrow as pa
import pytest

import reader
from tests import helpers


def write_ids_csv(path: pathlib.Path, rows: int) -> pathlib.Path:
    with path.open("w") as stream:
        stream.write("id\n")
        for start in range(0, rows, 100_000):
            stream.write("".join(f"{i}\n" for i in range(start, min(rows, start + 100_000))))
    return path


def test_applying_write_snapshot_turns_beams_periodic_data_flush_off(tmp_path, monkeypatch):
    """Before any pipeline that writes a snapshot runs: the job's own, or a user's ending in WriteSnapshot."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    from beam_jobs import WriteSnapshot

    monkeypatch.setattr(worker_handlers, "DATA_BUFFER_TIME_LIMIT_MS", 1000)  # Beam's own value
    pipeline = beam.Pipeline()
    _ = pipeline | beam.Create([]) | WriteSnapshot(str(tmp_path), snapshot_name="s")
    assert worker_handlers.DATA_BUFFER_TIME_LIMIT_MS == 0, "multi_threading corrupts data between stages with it"


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode", [[], ["--direct_running_mode=multi_threading", "--direct_num_workers=2"]], ids=["default", "threads"]
)
def test_two_million_3kb_rows(mode, tmp_path):
    """2,000,000 CSV ids -> a 3 KB image each (6.2 GB): failed 5 of 6 runs with a thread per core before the fix."""
    rows = 2_000_000
    csv = write_ids_csv(tmp_path / "ids.csv", rows)
    output = tmp_path / "out"
    try:
        _materialize_and_check(csv, output, rows, mode)
    finally:
        shutil.rmtree(output, ignore_errors=True)  # 6.2 GB; pytest keeps its last temp dirs


def _materialize_and_check(csv: pathlib.Path, output: pathlib.Path, rows: int, mode: list[str]) -> None:
    done = helpers.run_materialize(
        f"--input={csv}",
        "--input_format=csv",
        "--preprocessing_fn=tests.prep_functions:image_per_id",
        f"--output={output}",
        *mode,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    fields = helpers.summary_fields(done.stdout)
    assert fields["state"] == "written" and int(fields["rows"]) == rows, done.stdout
    snapshot = reader.open_snapshot(str(output))
    assert snapshot.num_rows == rows
    assert snapshot.verify() == snapshot.num_shards, "CRC32C, sizes and row counts of every shard"
    seen = np.zeros(rows, dtype=np.int64)
    for index in range(snapshot.num_shards):
        with pa.memory_map(snapshot.shard_path(index)) as source:
            shard = pa.ipc.open_file(source)
            for block in range(shard.num_record_batches):
                np.add.at(seen, shard.get_batch(block).column("id").to_numpy(), 1)
    assert (seen == 1).all(), "every id exactly once"
