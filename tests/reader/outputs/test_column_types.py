"""Every Arrow type the job can store is read back by every output, or refused when written.

Each snapshot is written by the real job (``beam_jobs.materialize.run``) from
Parquet, TFRecord or CSV files made here, then read with shuffle off so rows
come back in stored order and whole columns can be compared to what was written.
"""

import math
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import reader
from beam_jobs import materialize
from schemas.errors import SchemaMismatchError

tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

ROWS = 13
BATCH = 5  # batches of 5, 5, 3: partial batches and several blocks' worth of concatenation
JOB_FLAGS = ["--progress_interval_seconds=0", "--direct_num_workers=1", "--compression=NONE"]


def _ids():
    return list(range(ROWS))


def _parquet_columns() -> dict[str, pa.Array]:
    ids = _ids()
    return {
        "i8": pa.array([i - 6 for i in ids], pa.int8()),
        "u16": pa.array([i * 1000 for i in ids], pa.uint16()),
        "i64": pa.array([i + 2**40 for i in ids], pa.int64()),
        "f32": pa.array([None if i == 3 else i / 4 for i in ids], pa.float32()),
        "f64": pa.array([i / 3 for i in ids], pa.float64()),
        "flag": pa.array([i % 2 == 0 for i in ids]),
        "name": pa.array([None if i == 4 else f"n{i}" for i in ids], pa.string()),
        "blob": pa.array([bytes([i]) * i for i in ids], pa.large_binary()),
        "embedding": pa.array([[i + k / 64 for k in range(64)] for i in ids], pa.list_(pa.float32(), 64)),
        "grid": pa.array(
            [[[i, i + 1, i + 2], [i + 3, i + 4, i + 5]] for i in ids], pa.list_(pa.list_(pa.int32(), 3), 2)
        ),
        "tokens": pa.array([None if i == 2 else list(range(i % 4)) for i in ids], pa.large_list(pa.int64())),
        "words": pa.array([[f"w{k}" for k in range(i % 3)] for i in ids], pa.list_(pa.string())),
        "colour": pa.array([["red", "green"][i % 2] for i in ids]).dictionary_encode(),
        "code": pa.array([b"%02d" % i for i in ids], pa.binary(2)),
    }


#: What every output must give for each Parquet column: the values, rows in stored order.
EXPECTED = {
    "i8": [i - 6 for i in _ids()],
    "u16": [i * 1000 for i in _ids()],
    "i64": [i + 2**40 for i in _ids()],
    "f32": [math.nan if i == 3 else i / 4 for i in _ids()],
    "f64": [i / 3 for i in _ids()],
    "flag": [i % 2 == 0 for i in _ids()],
    "name": [None if i == 4 else f"n{i}" for i in _ids()],
    "blob": [bytes([i]) * i for i in _ids()],
    "embedding": [[np.float32(i + k / 64) for k in range(64)] for i in _ids()],
    "grid": [[[i, i + 1, i + 2], [i + 3, i + 4, i + 5]] for i in _ids()],
    "tokens": [[] if i == 2 else list(range(i % 4)) for i in _ids()],
    "words": [[f"w{k}" for k in range(i % 3)] for i in _ids()],
    "colour": [["red", "green"][i % 2] for i in _ids()],
    "code": [b"%02d" % i for i in _ids()],
}
DTYPES = {
    "i8": np.int8,
    "u16": np.uint16,
    "i64": np.int64,
    "f32": np.float32,
    "f64": np.float64,
    "flag": np.bool_,
    "embedding": np.float32,
    "grid": np.int32,
    "tokens": np.int64,
}
SHAPES = {"embedding": (None, 64), "grid": (None, 2, 3), "tokens": (None, None), "words": (None, None)}


def _materialize(tmp_path, input_format: str, pattern: str, *extra: str) -> str:
    output = tmp_path / "out"
    materialize.run([f"--input={pattern}", f"--input_format={input_format}", f"--output={output}", *JOB_FLAGS, *extra])
    return str(output)


@pytest.fixture(scope="module")
def parquet_snapshot(tmp_path_factory):
    directory = tmp_path_factory.mktemp("types")
    pq.write_table(pa.table(_parquet_columns()), directory / "types.parquet")
    return _materialize(directory, "parquet", str(directory / "types.parquet"))


def _plain(value):
    """A reader value as plain Python (lists, str/bytes, float), for comparison with EXPECTED."""
    if isinstance(value, (tf.Tensor, tf.RaggedTensor)):
        value = value.to_list() if isinstance(value, tf.RaggedTensor) else value.numpy()
    if isinstance(value, torch.Tensor):
        value = value.numpy()
    if isinstance(value, jax.Array):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        value = [_plain(v) for v in value] if value.dtype == object else value.tolist()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _same(got, expected) -> bool:
    if isinstance(expected, list):
        return isinstance(got, list) and len(got) == len(expected) and all(map(_same, got, expected))
    if isinstance(expected, float) and math.isnan(expected):
        return isinstance(got, float) and math.isnan(got)
    return got == expected


def _columns_of(steps) -> dict[str, list]:
    out: dict[str, list] = {}
    for step in steps:
        for name, values in step.items():
            out.setdefault(name, []).extend(_plain(values))
    return out


def _read(path, output):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the JAX 64-bit warning has a test of its own
        return list(reader.distributed_dataset(path, BATCH, shuffle=False, output=output))


def _check(columns: dict[str, list], *, tf_strings: bool = False) -> None:
    for name, expected in EXPECTED.items():
        if tf_strings:  # tf.string: bytes, and b"" for a missing value
            expected = [b"" if v is None else v.encode() if isinstance(v, str) else v for v in expected]
            expected = [[w.encode() for w in v] if name == "words" else v for v in expected]
        assert _same(columns[name], expected), f"{name}: {columns[name]} != {expected}"


def test_numpy_reads_every_type_with_its_dtype_and_shape(parquet_snapshot):
    steps = _read(parquet_snapshot, "numpy")
    assert [len(step["i8"]) for step in steps] == [5, 5, 3]
    for name, dtype in DTYPES.items():
        column = steps[0][name]
        assert (column[0].dtype if name == "tokens" else column.dtype) == dtype, name
    assert steps[0]["tokens"].dtype == object and steps[0]["name"].dtype == object
    spec = reader.open_snapshot(parquet_snapshot).element_spec
    assert {name: spec[name].shape for name in SHAPES} == SHAPES
    assert spec["colour"].dtype == "string" and spec["code"].dtype == "binary" and spec["tokens"].dtype == np.int64
    _check(_columns_of(steps))


def test_tf_output_and_element_spec_for_every_type(parquet_snapshot):
    dataset = reader.distributed_dataset(parquet_snapshot, BATCH, shuffle=False, output="tf")
    spec = dataset.element_spec
    assert spec["tokens"] == tf.RaggedTensorSpec((None, None), tf.int64, ragged_rank=1)
    assert spec["words"] == tf.RaggedTensorSpec((None, None), tf.string, ragged_rank=1)
    assert spec["embedding"] == tf.TensorSpec((None, 64), tf.float32, name="embedding")
    assert spec["grid"] == tf.TensorSpec((None, 2, 3), tf.int32, name="grid")
    assert spec["name"] == tf.TensorSpec((None,), tf.string, name="name")

    @tf.function(input_signature=[spec])
    def row_lengths(batch):
        return batch["tokens"].row_lengths()

    steps = list(dataset)
    assert [int(tf.reduce_sum(row_lengths(step))) for step in steps] == [4, 7, 5]
    _check(_columns_of(steps), tf_strings=True)


def test_reader_dataset_gives_the_same_for_every_type(parquet_snapshot):
    dataset = reader.dataset(parquet_snapshot, BATCH, shuffle=False)
    assert dataset.element_spec["tokens"] == tf.RaggedTensorSpec((None, None), tf.int64, ragged_rank=1)
    _check(_columns_of(dataset), tf_strings=True)


def test_torch_output_for_every_type(parquet_snapshot):
    steps = _read(parquet_snapshot, "torch")
    assert steps[0]["grid"].shape == (5, 2, 3) and steps[0]["u16"].dtype == torch.uint16
    assert isinstance(steps[0]["tokens"][1], np.ndarray), "lists: an object array of one array per row"
    _check(_columns_of(steps))


def test_jax_output_for_every_type_and_a_warning_for_64_bit_columns(parquet_snapshot):
    with pytest.warns(UserWarning, match=r"'i64'.*jax_enable_x64"):
        steps = list(reader.distributed_dataset(parquet_snapshot, BATCH, shuffle=False, output="jax"))
    assert steps[0]["i64"].dtype == np.int32, "JAX's default: the warning is not idle"
    jax.config.update("jax_enable_x64", True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            steps = list(reader.distributed_dataset(parquet_snapshot, BATCH, shuffle=False, output="jax"))
    finally:
        jax.config.update("jax_enable_x64", False)
    assert steps[0]["i64"].dtype == np.int64
    _check(_columns_of(steps))


def test_shuffled_reads_keep_list_rows_whole(parquet_snapshot):
    steps = list(reader.distributed_dataset(parquet_snapshot, 4, seed=3, shuffle_buffer_size=6, num_replicas=2))
    rows = {}
    for step in steps:
        for replica in step:
            for i8, tokens, grid in zip(replica["i8"], replica["tokens"], replica["grid"], strict=True):
                rows[int(i8) + 6] = (tokens.tolist(), grid.tolist())
    assert rows == {i: (EXPECTED["tokens"][i], EXPECTED["grid"][i]) for i in _ids()}


def _write_examples(path, rows: int) -> None:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(rows):
            features = {
                "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
                "scores": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 2] * (i % 3))),
            }
            if i % 4:  # missing in every fourth example
                features["text"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"t%d" % i]))
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())


def test_tfrecord_without_schema_reads_as_ragged_lists(tmp_path):
    _write_examples(tmp_path / "a.tfrecord", 9)
    path = _materialize(tmp_path, "tfrecord", str(tmp_path / "a.tfrecord"))
    spec = reader.open_snapshot(path).element_spec
    assert spec["id"].shape == (None, None) and spec["text"].dtype == "binary"
    expected = {
        "id": [[i] for i in range(9)],
        "scores": [[i / 2] * (i % 3) for i in range(9)],
        "text": [[b"t%d" % i] if i % 4 else [] for i in range(9)],
    }

    def by_id(columns):
        order = np.argsort([row[0] for row in columns["id"]])
        return {name: [columns[name][i] for i in order] for name in expected}

    for output in ("numpy", "tf", "torch", "jax"):
        assert by_id(_columns_of(_read(path, output))) == expected, output
    assert by_id(_columns_of(reader.dataset(path, 4))) == expected


def test_csv_missing_values(tmp_path):
    """CSV text is `string` now (as Parquet's): NumPy gets str, TensorFlow bytes; empty cells None / b""."""
    (tmp_path / "a.csv").write_text("id,name,score\n1,a,0.5\n2,,1.5\n3,c,\n")
    path = _materialize(tmp_path, "csv", str(tmp_path / "a.csv"))
    numpy_columns = _columns_of(_read(path, "numpy"))
    assert numpy_columns["name"] == ["a", None, "c"] and _same(numpy_columns["score"], [0.5, 1.5, math.nan])
    tf_columns = _columns_of(_read(path, "tf"))
    assert tf_columns["name"] == [b"a", b"", b"c"]
    assert _columns_of(reader.dataset(path, 2, shuffle=False))["name"] == [b"a", b"", b"c"]


@pytest.mark.parametrize(
    ("column", "words"),
    [
        (pa.array([1, None, 3]), r"'bad' \(int64\) has 1 missing values.*fill_null"),
        (pa.array([[[1]], [[2]], []]), "'bad' .*list of lists"),
        (pa.array([{"a": 1}] * 3), "'bad' \\(struct<a: int64>\\).*--preprocessing_fn"),
        (pa.array([0, 1, 2], pa.timestamp("ms")), "'bad' \\(timestamp\\[ms\\]\\).*int64"),
        (pa.array([1, 2, 3], pa.date32()), "'bad' \\(date32\\[day\\]\\)"),
        (pa.array([1, 2, 3]).cast(pa.decimal128(22, 2)), "'bad' \\(decimal128\\(22, 2\\)\\).*float64"),
    ],
    ids=["int-nulls", "nested-lists", "struct", "timestamp", "date", "decimal"],
)
def test_unreadable_columns_are_refused_at_write_naming_the_column(tmp_path, column, words):
    pq.write_table(pa.table({"id": pa.array([0, 1, 2]), "bad": column}), tmp_path / "a.parquet")
    with pytest.raises(SchemaMismatchError, match=words):
        _materialize(tmp_path, "parquet", str(tmp_path / "a.parquet"))
    assert not list((tmp_path / "out").glob("*/metadata.final")), "nothing is committed"
