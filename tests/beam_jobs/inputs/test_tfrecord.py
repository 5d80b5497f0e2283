"""TFRecord framing: what our reader accepts is what TensorFlow wrote; damage is located."""

import io

import pytest

from beam_jobs.inputs import tfrecord
from schemas.errors import InputDataError
from tests import helpers


@pytest.fixture(scope="module")
def tf_written(tmp_path_factory):
    (path,) = helpers.write_tfrecords(tmp_path_factory.mktemp("tfr"), num_rows=300, num_files=1)
    return path


def records(data: bytes, path: str = "f", chunk_bytes: int = 16 << 20) -> list[bytes]:
    return [r for _, batch in tfrecord.iter_batches(io.BytesIO(data), path, 7, chunk_bytes=chunk_bytes) for r in batch]


@pytest.mark.parametrize("chunk_bytes", [1000, 13, 1 << 20])  # records across chunks, a header across chunks, one
def test_reads_every_record_tensorflow_wrote(tf_written, chunk_bytes):
    import tensorflow as tf

    expected = [r.numpy() for r in tf.data.TFRecordDataset(str(tf_written))]
    got = records(tf_written.read_bytes(), chunk_bytes=chunk_bytes)
    assert got == expected and len(got) == 300


def test_batches_keep_order_and_first_index(tf_written):
    batches = list(tfrecord.iter_batches(io.BytesIO(tf_written.read_bytes()), "f", batch_size=128))
    assert [(first, len(records)) for first, records in batches] == [(0, 128), (128, 128), (256, 44)]


def test_garbled_byte_names_record_and_offset(tf_written):
    data = bytearray(tf_written.read_bytes())
    record_size = len(data) // 300  # every record of this file has the same size
    data[record_size * 7 + 20] ^= 0xFF
    with pytest.raises(InputDataError, match=rf"/x.tfrecord: record 7 at byte {record_size * 7}: data checksum"):
        records(bytes(data), "/x.tfrecord")


def test_truncated_file_is_named(tf_written):
    data = tf_written.read_bytes()[:-10]
    with pytest.raises(InputDataError, match="record 299 .* truncated data"):
        records(data, "/x.tfrecord")
    with pytest.raises(InputDataError, match="record 300 .* truncated header \\(5 of 12 bytes\\)"):
        records(tf_written.read_bytes() + b"12345", "/x.tfrecord")


def test_not_a_tfrecord(tmp_path):
    with pytest.raises(InputDataError, match="record 0 at byte 0: length checksum mismatch"):
        records(b"hello, this is a text file\n" * 3, "/x.txt")
