"""Writes tests/golden/root/golden-<FORMAT_VERSION>: the tiny snapshot that pins the on-disk format.

Run once when the format changes on purpose (and bump FORMAT_VERSION):
``python -m tests.golden.make_golden``. Goldens of earlier versions stay (``golden``
is format 1.0): test_golden.py reads every committed copy with today's code and
checks every byte-level promise still holds.
"""

import pathlib
import shutil

import apache_beam as beam
import numpy as np

from beam_jobs import WriteSnapshot
from schemas import columns, metadata

ROOT = pathlib.Path(__file__).parent / "root"
#: The golden of this code's format version (1.0's is plain "golden").
NAME = f"golden-{metadata.FORMAT_VERSION}"


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
    shutil.rmtree(ROOT / NAME, ignore_errors=True)
    with beam.Pipeline() as pipeline:
        _ = (
            pipeline
            | beam.Create([0, 10])
            | beam.Map(golden_batch)
            | WriteSnapshot(str(ROOT), snapshot_name=NAME, block_size_bytes=200, compression="LZ4")
        )


if __name__ == "__main__":
    main()
