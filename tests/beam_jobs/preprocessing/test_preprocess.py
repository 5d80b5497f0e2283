"""What a preprocessing function may return, and filters that drop every row of a batch."""

import numpy as np
import pyarrow as pa
import pytest

from beam_jobs import materialize
from beam_jobs.preprocessing.batch_fn import PreprocessFn, to_record_batch
from schemas import columns
from schemas.errors import EmptySnapshotError, PreprocessingError
from tests import helpers

SPEC = "tests.beam_jobs.preprocessing.test_preprocess"


def drop_everything(batch: pa.RecordBatch) -> pa.Table:
    """A filter whose predicate matches no row: Arrow gives a Table with no batches at all."""
    return pa.Table.from_batches([batch]).filter(pa.array([False] * batch.num_rows))


def keep_multiples_of_three(batch: pa.RecordBatch) -> pa.Table:
    """Keeps ids divisible by 3, as a Table; some batches may keep nothing."""
    return pa.Table.from_batches([batch]).filter(pa.array(batch.column("id").to_numpy() % 3 == 0))


def _batch(rows: int) -> pa.RecordBatch:
    ids = np.arange(rows, dtype=np.int64)
    return columns.record_batch_from_arrays({"id": ids, "image": np.zeros((rows, 2, 2), np.uint8)})


@pytest.mark.parametrize(
    "empty",
    [
        pytest.param(lambda b: pa.Table.from_batches([b]).filter(pa.array([False] * b.num_rows)), id="filtered"),
        pytest.param(lambda b: b.schema.empty_table(), id="empty_table"),
        pytest.param(lambda b: pa.Table.from_batches([], schema=b.schema), id="no_batches"),
    ],
)
def test_an_empty_table_becomes_an_empty_batch_with_its_schema(empty):
    batch = _batch(5)
    result = to_record_batch(empty(batch), "m:f")
    assert isinstance(result, pa.RecordBatch)
    assert result.num_rows == 0 and result.schema.equals(batch.schema, check_metadata=True)


def test_a_multi_chunk_table_becomes_one_batch():
    table = pa.Table.from_batches([_batch(3), _batch(4)])
    result = to_record_batch(table, "m:f")
    assert result.num_rows == 7 and result.schema.equals(table.schema)


def test_other_return_types_still_name_the_function():
    with pytest.raises(PreprocessingError, match="preprocessing_fn m:f returned list; return a pyarrow.RecordBatch"):
        to_record_batch([1, 2], "m:f")


def test_preprocess_fn_yields_an_empty_batch_for_a_filter_that_drops_everything():
    fn = PreprocessFn(f"{SPEC}:drop_everything", {})
    fn.setup()
    (first,) = list(fn.process(_batch(5)))
    (second,) = list(fn.process(_batch(7)))  # the schema check still holds across empty results
    assert first.num_rows == second.num_rows == 0
    assert first.schema.equals(_batch(1).schema)


def test_materialize_with_a_filter_that_empties_batches(tfrecord_input, tmp_path):
    """End to end: empty results add no rows and no shards; the rest is committed.

    A function that keeps no row at all is refused unless --allow_empty.
    """
    dropping = [
        f"--input={tfrecord_input['pattern']}",
        f"--schema={tfrecord_input['schema']}",
        f"--output={tmp_path / 'none'}",
        f"--preprocessing_fn={SPEC}:drop_everything",
    ]
    with pytest.raises(EmptySnapshotError, match=f"{SPEC}:drop_everything kept none of the 3000 rows read"):
        materialize.run(dropping)
    dropped = materialize.run([*dropping, "--allow_empty"])
    assert dropped.state == "written" and dropped.rows == 0 and dropped.shards == 0
    kept = materialize.run(
        [
            f"--input={tfrecord_input['pattern']}",
            f"--schema={tfrecord_input['schema']}",
            f"--output={tmp_path / 'some'}",
            f"--preprocessing_fn={SPEC}:keep_multiples_of_three",
        ]
    )
    assert kept.state == "written" and kept.rows == 1000
    rows = helpers.snapshot_rows(tmp_path / "some", kept.snapshot_id)
    ids = sorted(int(np.frombuffer(dict(key)["id"], np.int64)[0]) for key in rows)
    assert ids == list(range(0, 3000, 3))
