"""Small snapshots for tests and benches, written by a real Beam pipeline (DirectRunner) ending in WriteSnapshot.

``write_snapshot`` writes given batches; ``write_random_rows`` writes rows of
one of the benches' ``SHAPES`` (100 B, 3 KB, 150 KB), generated in the
pipeline, so a snapshot of hundreds of MB never sits in the driver's memory. Beam, pyarrow and the contract
are imported by the writers only: a bench's worker process that imports this module for ``SHAPES`` (a NumPy
gather's, whose memory is measured) loads NumPy alone.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

import numpy as np

SHAPES = {
    "100B": {"features": ((23,), "float32"), "label": ((), "int64")},
    "3KB": {"image": ((32, 32, 3), "uint8"), "features": ((16,), "float32"), "label": ((), "int64")},
    "150KB": {"image": ((224, 224, 3), "uint8"), "label": ((), "int64")},
}


def row_bytes(size: str) -> int:
    return sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in SHAPES[size].values())


def num_rows(size: str, megabytes: int) -> int:
    return -(-megabytes * 10**6 // row_bytes(size))


def random_batch(size: str, start: int, count: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(start)
    batch = {}
    for name, (shape, dtype) in SHAPES[size].items():
        if name == "label":
            batch[name] = np.arange(start, start + count, dtype=np.int64)
        elif dtype == "uint8":
            batch[name] = rng.integers(0, 256, size=(count, *shape), dtype=np.uint8)
        else:
            batch[name] = rng.random((count, *shape), dtype=np.float32)
    return batch


def write_snapshot(root, name: str, batches: list[dict[str, np.ndarray]], **write_options) -> str:
    """A finalized snapshot written by a real Beam pipeline (DirectRunner) ending in WriteSnapshot.

    Each batch is one element, so ``shard_size_bytes``/``block_size_bytes`` and
    the batch sizes shape the shards. Returns the snapshot directory. The
    batches reach the pipeline as Arrow IPC files it reads: given to
    ``beam.Create`` they were pickled into the pipeline's graph and
    bz2-compressed, about 0.6 s per MB of random bytes.
    """
    import apache_beam as beam
    import pyarrow as pa

    from beam_jobs import WriteSnapshot
    from schemas import columns

    with tempfile.TemporaryDirectory(prefix="snapfeed-test-batches-") as staged:
        files = []
        for index, batch in enumerate(batches):
            record_batch = columns.record_batch_from_arrays(batch)
            files.append(os.path.join(staged, f"batch-{index:05d}.arrow"))
            with pa.OSFile(files[-1], "wb") as sink, pa.ipc.new_file(sink, record_batch.schema) as writer:
                writer.write_batch(record_batch)
        options = beam.options.pipeline_options.PipelineOptions(["--direct_num_workers=1"])
        with beam.Pipeline(options=options) as pipeline:
            _ = (
                pipeline
                | beam.Create(files, reshuffle=False)
                | beam.Map(_read_staged_batch)
                | WriteSnapshot(str(root), snapshot_name=name, **write_options)
            )
    return str(pathlib.Path(root) / name)


def _read_staged_batch(path: str):
    import pyarrow as pa

    with pa.OSFile(path, "rb") as source:
        return pa.ipc.open_file(source).get_batch(0)


def write_random_rows(directory: pathlib.Path, size: str, rows: int) -> str:
    """``rows`` rows of ``SHAPES[size]`` (``label`` is the row's index) as the snapshot ``bench-{size}`` under
    ``directory`` (``$BENCH_CODEC`` its compression, AUTO by default); returns its path."""
    import apache_beam as beam

    from beam_jobs import WriteSnapshot
    from schemas import columns

    chunk = max(1, (8 << 20) // row_bytes(size))
    starts = list(range(0, rows, chunk))
    with beam.Pipeline() as pipeline:
        _ = (
            pipeline
            | beam.Create(starts, reshuffle=False)
            | beam.Map(lambda s: columns.record_batch_from_arrays(random_batch(size, s, min(chunk, rows - s))))
            | WriteSnapshot(
                str(directory), snapshot_name=f"bench-{size}", compression=os.environ.get("BENCH_CODEC", "AUTO")
            )
        )
    return str(directory / f"bench-{size}")
