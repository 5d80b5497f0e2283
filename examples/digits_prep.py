"""Preprocessing for the bundled digits data: the function `make demo` materializes with.

Turns the flat ``pixels`` (int64[64], 0..16) into a normalized float32 image
``[8, 8, 1]`` and keeps ``label``. ``params["scale"]`` (default 1/16) is part of
the fingerprint, so changing it writes a new snapshot.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def preprocess(batch: pa.RecordBatch, params: dict) -> dict[str, np.ndarray]:
    scale = float(params.get("scale", 1.0 / 16.0))
    column = batch.column("pixels")
    # A fixed-shape tensor column (with the schema) or a list column (without): same values.
    pixels = np.asarray(getattr(column, "storage", column).flatten())
    image = (pixels.reshape(batch.num_rows, 8, 8, 1) * scale).astype(np.float32)
    return {"image": image, "label": batch.column("label").to_numpy().astype(np.int64)}
