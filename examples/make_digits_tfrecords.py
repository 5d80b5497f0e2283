"""Regenerates examples/data/digits/*.tfrecord from the bundled digits.csv.gz.

Each tf.Example has ``pixels`` (int64[64], an 8x8 image with values 0..16) and
``label`` (int64). The TFRecords are committed; this script documents how
they were made: ``python -m examples.make_digits_tfrecords``.
"""

from __future__ import annotations

import csv
import gzip
import pathlib

DATA_DIR = pathlib.Path(__file__).parent / "data" / "digits"
NUM_FILES = 2


def main() -> None:
    import tensorflow as tf

    with gzip.open(DATA_DIR / "digits.csv.gz", "rt") as handle:
        rows = [list(map(int, map(float, row))) for row in csv.reader(handle)]
    writers = [
        tf.io.TFRecordWriter(str(DATA_DIR / f"digits-{i:05d}-of-{NUM_FILES:05d}.tfrecord")) for i in range(NUM_FILES)
    ]
    for index, row in enumerate(rows):
        features = {
            "pixels": tf.train.Feature(int64_list=tf.train.Int64List(value=row[:64])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[row[64]])),
        }
        writers[index % NUM_FILES].write(
            tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
        )
    for writer in writers:
        writer.close()
    print(f"wrote {len(rows)} examples into {NUM_FILES} files under {DATA_DIR}")


if __name__ == "__main__":
    main()
