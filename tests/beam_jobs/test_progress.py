"""The job's progress line (rows/s, and the time left where the inputs' rows can be estimated) and its estimate."""

from __future__ import annotations

import gzip
import json
import re
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from beam_jobs.inputs.row_estimate import SAMPLE_BYTES, estimate_rows
from beam_jobs.progress import ProgressReporter
from schemas.snapshot_pb2 import InputFile
from tests import helpers


def _files(*paths) -> list[InputFile]:
    return [InputFile(path=str(p), size_bytes=p.stat().st_size) for p in paths]


def test_tfrecord_rows_are_exact_for_a_sampled_file_and_close_when_scaled(tmp_path):
    small = helpers.write_tfrecords(tmp_path / "small", num_rows=3000, num_files=3)
    assert estimate_rows("tfrecord", _files(*small)) in range(2990, 3011)  # the first file read whole, then scaled
    assert estimate_rows("tfrecord", _files(small[0])) == 1000
    big = helpers.write_tfrecords(tmp_path / "big", num_rows=40_000, num_files=1)
    assert big[0].stat().st_size > SAMPLE_BYTES, "the estimate must scale a sample here"
    assert abs(estimate_rows("tfrecord", _files(*big)) - 40_000) < 40_000 * 0.03


def test_csv_and_parquet_rows(tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text("a,b\n" + "".join(f"{i},{i * 2}\n" for i in range(500)))
    assert estimate_rows("csv", _files(csv), csv_skip_header_lines=1) == 500
    unterminated = tmp_path / "last.csv"
    unterminated.write_text("a,b\n1,2\n3,4")
    assert estimate_rows("csv", _files(unterminated), csv_skip_header_lines=1) == 2
    tables = []
    for index, rows in enumerate((700, 300)):
        tables.append(tmp_path / f"part-{index}.parquet")
        pq.write_table(pa.table({"x": np.arange(rows)}), tables[-1], row_group_size=100)
    assert estimate_rows("parquet", _files(*tables)) == 1000, "the footers' exact counts"


def test_no_estimate_where_sizes_say_nothing_or_nothing_can_be_read(tmp_path):
    packed = tmp_path / "rows.csv.gz"
    packed.write_bytes(gzip.compress(b"a\n1\n2\n"))
    assert estimate_rows("csv", _files(packed)) is None
    assert estimate_rows("tfrecord", []) is None
    gone = InputFile(path=str(tmp_path / "gone.tfrecord"), size_bytes=100)
    assert estimate_rows("tfrecord", [gone]) is None


def test_the_line_says_rows_per_second_and_the_time_left(tmp_path):
    reporter = ProgressReporter(str(tmp_path), 0, expected_rows=1_000_000)
    assert reporter.line(120_000, 9_600_000, 3, 10.0) == (
        "progress: 120000 of about 1000000 rows (12%), 9.6 MB in 3 shards after 10 s: 12000 rows/s, "
        "about 1 min 13 s left"
    )
    assert reporter.line(1_100_000, 0, 4, 7200.4).endswith("after 2 h 0 min: 153 rows/s"), "past the estimate"
    unknown = ProgressReporter(str(tmp_path), 0)
    assert unknown.line(0, 0, 0, 0.0) == "progress: 0 rows, 0.0 MB in 0 shards after 0 s: 0 rows/s"


def test_a_running_job_prints_progress_and_its_summary_rows_per_second(tfrecord_input, tmp_path):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    output = tmp_path / "out"
    flags = (
        f"--input={tfrecord_input['pattern']}",
        f"--schema={tfrecord_input['schema']}",
        f"--output={output}",
        "--preprocessing_fn=tests.prep_functions:wait_for_barrier",
        f"--preprocessing_params={json.dumps({'dir': str(barrier), 'pass_batches': 1})}",
        "--block_size_bytes=200",
        "--shard_size_bytes=2000",
        "--direct_running_mode=in_memory",
        "--progress_interval_seconds=0.2",
    )
    job = helpers.start_materialize(*flags)
    deadline = time.monotonic() + 120
    while not list(barrier.glob("started-*")) and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.5)  # several progress lines while the function holds the rest
    (barrier / "go").touch()
    out, err = job.communicate(timeout=300)
    assert job.returncode == 0, err[-3000:]
    lines = [
        m
        for m in re.finditer(r"progress: (\d+) of about (\d+) rows \(\d+%\), .* shards after \d+ s: (\d+) rows/s", err)
    ]
    assert lines, err
    held = [m for m in lines if 0 < int(m.group(1)) < 3000]
    assert held and all(abs(int(m.group(2)) - 3000) <= 30 for m in lines), err
    assert any("left" in line for line in err.splitlines() if line.startswith("progress: ") and " 0 rows/s" not in line)
    fields = helpers.summary_fields(out)
    assert fields["rows"] == "3000" and float(fields["rows_per_second"]) > 0
    again = helpers.summary_fields(helpers.run_materialize(*flags).stdout)
    assert again["state"] == "reused" and "rows_per_second" not in again, "a reuse reads no rows"
