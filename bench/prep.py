"""The benchmark's preprocessing: decode the raw image bytes, normalize the features.

The same arithmetic is written once for snapfeed (NumPy over a RecordBatch)
and once for tf.data (TensorFlow ops over a batch of parsed examples), so both
sides of the benchmark do identical work.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

IMAGE_SHAPE = (32, 32, 3)
FEATURES = 16
FEATURE_MEAN = 0.5
FEATURE_STD = 0.29


def _values(column: pa.Array) -> pa.Array:
    return getattr(column, "storage", column).flatten()


def normalize(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    rows = batch.num_rows
    images = batch.column("image")  # binary: an offsets buffer and one values buffer, decoded zero-copy
    offsets = np.frombuffer(images.buffers()[1], dtype=np.int32, count=len(images) + 1, offset=images.offset * 4)
    if offsets[-1] - offsets[0] != rows * 3072:
        raise ValueError(f"every image must have 3072 bytes; this batch has {offsets[-1] - offsets[0]} for {rows} rows")
    image = np.frombuffer(images.buffers()[2], dtype=np.uint8, count=rows * 3072, offset=int(offsets[0]))
    image = image.reshape(rows, *IMAGE_SHAPE)
    features = np.asarray(_values(batch.column("features"))).reshape(rows, FEATURES)
    return {
        "image": image,
        "features": ((features - FEATURE_MEAN) / FEATURE_STD).astype(np.float32),
        "label": np.asarray(batch.column("label")),
    }


def tf_parse_and_normalize(serialized):
    import tensorflow as tf

    parsed = tf.io.parse_example(
        serialized,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "features": tf.io.FixedLenFeature([FEATURES], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    image = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), (-1, *IMAGE_SHAPE))
    return {
        "image": image,
        "features": (parsed["features"] - FEATURE_MEAN) / FEATURE_STD,
        "label": parsed["label"],
    }
