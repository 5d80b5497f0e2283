"""Column types by input format: a CSV and the same table as Parquet make snapshots of one Arrow schema.

tfx-bsl's CSV decoder gave text as large_binary and floats as float32 (5.1 read
back as 5.099999904632568) where Parquet gives string and float64
(docs/materialize.md "Column types by input format").
"""

from __future__ import annotations

import pathlib

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from beam_jobs import materialize
from schemas import metadata
from schemas.paths import SnapshotPaths
from tests import helpers

IRIS = helpers.REPO_ROOT / "examples" / "data" / "iris" / "iris.csv"
TEXT_CSV = 'id,name,score,note\n1,café,0.123456789012,\n2,,1e300,a "quoted" word\n3,x,,\n'


def _snapshot_table(root: pathlib.Path, *flags: str) -> tuple[pa.Schema, pa.Table]:
    result = materialize.run([*flags, f"--output={root}", "--progress_interval_seconds=0"])
    manifest = metadata.read_manifest(SnapshotPaths(str(root), result.snapshot_id))
    if manifest.fingerprint_components.input_format.startswith("csv"):
        # Other types than before for the same files: another fingerprint, so an older snapshot is not reused.
        assert manifest.fingerprint_components.input_format == "csv (int64, float64, string)"
    table = pa.concat_tables(
        pa.ipc.open_file(str(pathlib.Path(result.path) / shard.path)).read_all() for shard in manifest.shards
    )
    return table.schema, table.sort_by("id" if "id" in table.column_names else "sepal_length")


@pytest.mark.parametrize("source", ["iris", "text"])
def test_a_csv_and_the_same_table_as_parquet_give_one_arrow_schema_and_values(source, tmp_path):
    csv_path = IRIS if source == "iris" else tmp_path / "table.csv"
    if source == "text":
        csv_path.write_text(TEXT_CSV, encoding="utf-8")
    parquet_path = tmp_path / "table.parquet"
    empty_is_null = pacsv.ConvertOptions(strings_can_be_null=True)  # as the job reads an empty CSV cell
    pq.write_table(pacsv.read_csv(csv_path, convert_options=empty_is_null), parquet_path)

    csv_schema, csv_rows = _snapshot_table(tmp_path / "from_csv", f"--input={csv_path}")
    parquet_schema, parquet_rows = _snapshot_table(tmp_path / "from_parquet", f"--input={parquet_path}")

    assert csv_schema.remove_metadata() == parquet_schema.remove_metadata()
    assert repr(csv_rows.to_pylist()) == repr(parquet_rows.to_pylist())  # repr: an empty float cell is NaN in both
    if source == "iris":
        assert [str(t) for t in csv_schema.types] == ["double"] * 4 + ["int64"]
        assert csv_rows.column("sepal_length")[0].as_py() == 4.3  # parsed as float64, not widened from float32
    else:
        assert [str(t) for t in csv_schema.types] == ["int64", "string", "double", "string"]
        assert csv_rows.column("name").to_pylist() == ["café", None, "x"]
