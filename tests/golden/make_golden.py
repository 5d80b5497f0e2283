"""Writes tests/golden/root/golden: the tiny snapshot that pins the on-disk format.

Run once when the format changes on purpose (and bump FORMAT_VERSION):
``python -m tests.golden.make_golden``. test_golden.py reads the committed
copy with today's code and checks every byte-level promise still holds.
"""

import pathlib
import shutil

import apache_beam as beam
import numpy as np

from beam_jobs import WriteSnapshot
from schemas import columns

ROOT = pathlib.Path(__file__).parent / "root"


def golden_batch(start: int):
    ids = np.arange(start, start + 10)
    return columns.record_batch_from_arrays(
        {
            "id": ids,
            "image": (ids[:, None, None, None] + np.arange(2 * 2 * 3).reshape(1, 2, 2, 3)).astype(np.uint8),
            "score": (ids / 4).astype(np.float32),
            "name": np.array([f"row-{i}".encode() for i in ids], dtype=object),
        }
    )


def main() -> None:
    shutil.rmtree(ROOT, ignore_errors=True)
    with beam.Pipeline() as pipeline:
        _ = (
            pipeline
            | beam.Create([0, 10])
            | beam.Map(golden_batch)
            | WriteSnapshot(str(ROOT), snapshot_name="golden", block_size_bytes=200, compression="LZ4")
        )


if __name__ == "__main__":
    main()
