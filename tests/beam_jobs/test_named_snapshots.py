"""A ``--snapshot_name`` directory is found by name, so its recorded fingerprint decides reuse.

The RFC lets a name replace the fingerprint as the directory; a rerun with a
shrunken input or other parameters then finds the old run there. Before, it
printed ``state=reused rows=3000`` over a 99-row input and ``snapfeed explain``
said nothing changed.
"""

from __future__ import annotations

import json
import shlex

import pytest

from beam_jobs import materialize
from reader.snapshots import main as snapfeed
from schemas.errors import UsageError
from tests import helpers


def _flags(raw, output, scale: int = 2) -> list[str]:
    return [
        f"--input={raw}/*.tfrecord",
        f"--schema={raw}/schema.pbtxt",
        f"--output={output}",
        "--snapshot_name=daily",
        "--preprocessing_fn=tests.prep_functions:normalize",
        f"--preprocessing_params={json.dumps({'scale': scale})}",
        "--progress_interval_seconds=0",
    ]


@pytest.fixture
def daily(tmp_path):
    """A finalized ``daily`` of 3,000 rows, then its input shrunk to 99 rows in the same file."""
    raw, output = tmp_path / "raw", tmp_path / "out"
    helpers.write_tfrecords(raw, num_rows=3000, num_files=1)
    helpers.write_schema(raw / "schema.pbtxt")
    first = materialize.run(_flags(raw, output))
    assert (first.state, first.rows) == ("written", 3000)
    helpers.write_tfrecords(raw, num_rows=99, num_files=1)
    return raw, output, first


def _explain(capsys, output, flags: list[str]) -> dict:
    code = snapfeed(["explain", str(output), "--job-flags", shlex.join(flags), "--json"])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_a_shrunken_input_is_refused_in_one_line_and_explained(daily, capsys):
    raw, output, first = daily
    flags = _flags(raw, output)
    with pytest.raises(UsageError, match=rf"holds run {first.run_id} of another job .*input file .*--mode=write"):
        materialize.run(flags)
    completed = helpers.run_materialize(*flags)
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2 and len(lines) == 1, completed.stderr
    assert "state=reused" not in completed.stdout
    explained = _explain(capsys, output, flags)
    assert explained["reused"] is False and any("input file" in change for change in explained["changes"])

    rewritten = materialize.run([*flags, "--mode=write"])
    assert (rewritten.state, rewritten.rows) == ("written", 99)
    again = materialize.run(flags)
    assert (again.state, again.rows, again.run_id) == ("reused", 99, rewritten.run_id)
    assert _explain(capsys, output, flags) == {
        "snapshot_id": "daily",
        "reused": True,
        "changes": [],
        "compared_with": None,
    }


def test_other_preprocessing_params_are_refused_naming_them(daily, capsys):
    raw, output, first = daily
    helpers.write_tfrecords(raw, num_rows=3000, num_files=1)  # the input as it was, but for its mtime
    flags = _flags(raw, output, scale=3)
    with pytest.raises(UsageError, match=r'preprocessing params: \{"scale":2\} -> \{"scale":3\}'):
        materialize.run(flags)
    code = snapfeed(["explain", str(output), "--job-flags", shlex.join(flags)])
    text = capsys.readouterr().out
    assert code == 0 and text.startswith("the job would refuse daily") and '{"scale":3}' in text
