"""Workers of an EXTERNAL worker pool import --preprocessing_fn from the package installed in the pool's environment.

docs/engines-and-stores.md documents it ("A Portable worker pool"): such a pool installs
nothing staged, so the user's sdist is pip-installed where the pool runs. The
driver here imports a different copy of the module (it marks rows 1, the
installed one marks them 2), so the snapshot says which copy the workers ran.
"""

from __future__ import annotations

import collections
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from testing import engines
from tests import helpers

MODULE = "pool_marked_prep"
SOURCE = """import numpy as np


def preprocess(batch):
    ids = batch.column("id").to_numpy()
    return {{"id": ids, "loaded_by": np.full(len(ids), {mark}, dtype=np.int64)}}
"""


def _install_package(tmp_path) -> str:
    """Builds the user's sdist and pip-installs it (offline) into a directory the pool puts on its path."""
    project = tmp_path / "project"
    project.mkdir()
    (project / f"{MODULE}.py").write_text(SOURCE.format(mark=2))
    (project / "setup.py").write_text(
        f"from setuptools import setup\nsetup(name='{MODULE}', version='0.1', py_modules=['{MODULE}'])\n"
    )
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "--dist-dir", "dist"], cwd=project, check=True)
    (archive,) = (project / "dist").glob("*.tar.gz")
    site = tmp_path / "pool-site"
    helpers.pip_install_offline(str(archive), site, check=True)
    return str(site)


@pytest.mark.slow
def test_pool_workers_run_the_module_installed_in_their_environment(tmp_path):
    pq.write_table(pa.table({"id": np.arange(300, dtype=np.int64)}), tmp_path / "ids.parquet")
    driver_copy = tmp_path / "driver"
    driver_copy.mkdir()
    (driver_copy / f"{MODULE}.py").write_text(SOURCE.format(mark=1))
    # The pool starts each worker with the `python` on its PATH: this environment's, plus the installed package.
    with engines.worker_pool(pythonpath=(_install_package(tmp_path),)) as address:
        completed = helpers.run_materialize(
            f"--input={tmp_path / 'ids.parquet'}",
            "--input_format=parquet",
            f"--output={tmp_path / 'out'}",
            f"--preprocessing_fn={MODULE}:preprocess",
            *engines.portable_flags(address),
            timeout=240,
            PYTHONPATH=f"{driver_copy}:{helpers.REPO_ROOT}",
        )
    assert completed.returncode == 0, completed.stderr[-3000:]
    path = completed.stdout.splitlines()[-1].split(" ", 1)[0]
    rows = helpers.snapshot_rows(str(tmp_path / "out"), path.rsplit("/", 1)[1])
    marks = collections.Counter(dict(key)["loaded_by"] for key in rows.elements())
    assert marks == {np.int64(2).tobytes(): 300}, "every row was preprocessed by the pool's installed package"
