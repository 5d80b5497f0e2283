"""Preprocessing functions the materialize tests name with --preprocessing_fn."""

from __future__ import annotations

import functools
import itertools
import os
import pathlib
import time

import numpy as np
import pyarrow as pa


def _ids(batch: pa.RecordBatch) -> np.ndarray:
    return batch.column("id").to_numpy()


def normalize(batch: pa.RecordBatch, params: dict) -> dict[str, np.ndarray]:
    """Batch-at-a-time normalization with fixed statistics, so every row's result
    is independent of how a runner happened to batch it."""
    features = batch.column("features").to_numpy_ndarray().astype(np.float32)
    scale = float(params.get("scale", 1.0))
    return {
        "id": _ids(batch),
        "features": ((features - 100.0) / 50.0 * scale).astype(np.float32),
        "grid": np.repeat(features[:, None, :], 2, axis=1),  # a [2, 4] tensor per row
        "label": batch.column("label").to_numpy(),
    }


def keep_ids(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    return {"id": _ids(batch), "label": batch.column("label").to_numpy()}


def explode(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    raise ZeroDivisionError("boom in user code")


def wrong_type(batch: pa.RecordBatch) -> list:
    return [1, 2, 3]


_schema_changer_calls = itertools.count(1)


def schema_changer(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """Returns int64 ids for the first batch and float64 ids after it. Each call takes its number at once
    (``next`` on a count): with a shared counter incremented then read, two threads (the DirectRunner's
    multi_threading) could both read 2, and no batch had int64 ids."""
    call = next(_schema_changer_calls)
    ids = _ids(batch)
    return {"id": ids if call == 1 else ids.astype(np.float64)}


_barrier_calls = {"count": 0}


def wait_for_barrier(batch: pa.RecordBatch, params: dict) -> dict[str, np.ndarray]:
    """Lets ``params["pass_batches"]`` batches through, then announces itself in
    ``params["dir"]`` and blocks until a ``go`` file appears there.

    Lets a test hold several writers inside their pipelines at once (races), or
    kill one after it has committed some shards (crash).
    """
    _barrier_calls["count"] += 1
    if _barrier_calls["count"] <= int(params.get("pass_batches", 0)):
        return keep_ids(batch)
    directory = pathlib.Path(params["dir"])
    (directory / f"started-{os.getpid()}").touch()
    deadline = time.monotonic() + float(params.get("timeout", 120))
    while not (directory / "go").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no go file in {directory}")
        time.sleep(0.05)
    return keep_ids(batch)


def returns_nothing(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """A function whose author forgot to fill the result: no columns for every batch."""
    return {}


def drops_every_row(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A filter whose condition no row meets."""
    return batch.filter(pa.array(np.zeros(batch.num_rows, dtype=bool)))


def exits(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A function that calls sys.exit, as a script turned into a function might."""
    raise SystemExit(3)


@functools.cache
def _image_pool() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, size=16 << 20, dtype=np.uint8)


def image_per_id(batch: pa.RecordBatch) -> dict[str, np.ndarray]:
    """A deterministic, incompressible 3 KB uint8[32, 32, 3] image per CSV id, plus the id.

    Each id's image is a window of a seeded random pool; neighbouring ids'
    windows do not overlap, so LZ4 finds nothing to save (AUTO stores NONE).
    """
    ids = batch.column("id").to_numpy(zero_copy_only=False).astype(np.int64)
    pool = _image_pool()
    windows = np.lib.stride_tricks.sliding_window_view(pool, 32 * 32 * 3)
    offsets = (ids * 7919) % (len(pool) - 32 * 32 * 3)
    return {"id": ids, "image": windows[offsets].reshape(-1, 32, 32, 3)}
