"""Engines and user code shared by the Beam job tests: a dask.distributed cluster of worker processes."""

from __future__ import annotations

import pathlib

import pytest

from testing import engines

#: A user module the workers can only import through the PYTHONPATH the test gives them.
PREP_SOURCE = '''
import os
import pathlib

import numpy as np


def scaled(batch, params):
    """Every scalar column as float64 times params["scale"], plus their row sum (the digits' pixels are dropped).

    Where $ENGINE_PREP_PIDS names a directory (the engines' workers), it also leaves a file named by its pid.
    """
    if os.environ.get("ENGINE_PREP_PIDS"):
        (pathlib.Path(os.environ["ENGINE_PREP_PIDS"]) / str(os.getpid())).touch()
    arrays = {name: np.asarray(batch.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)
              for name in batch.schema.names if name != "pixels"}
    out = {name: values * params["scale"] for name, values in arrays.items()}
    out["row_sum"] = sum(arrays.values())
    return out


def tft_scaled(inputs):
    """A tf.Transform function (traced in the driver; the workers run its graph): z-scores and a vocabulary."""
    import tensorflow as tf
    import tensorflow_transform as tft

    return {
        "id": inputs["id"],
        "value_z": tft.scale_to_z_score(inputs["value"]),
        "label_id": tft.compute_and_apply_vocabulary(tf.strings.as_string(inputs["label"]), vocab_filename="labels"),
    }
'''


@pytest.fixture(scope="session")
def user_module(tmp_path_factory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("user_code")
    (directory / "engine_prep.py").write_text(PREP_SOURCE)
    return directory


@pytest.fixture(scope="session")
def pids(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("worker_pids")


@pytest.fixture(scope="session")
def dask_scheduler(user_module, pids):
    """The scheduler address of a LocalCluster of two worker processes on 127.0.0.1 (``testing.engines``) whose
    workers can import the user module."""
    pytest.importorskip("distributed")
    with engines.dask_cluster(2, pythonpath=(str(user_module),), env={"ENGINE_PREP_PIDS": str(pids)}) as address:
        yield address
