"""The sdist the job stages for remote workers installs, and brings what the workers import."""

from __future__ import annotations

from beam_jobs.runners import worker_packages
from tests import helpers


def test_snapfeeds_staged_sdist_installs_without_network(tmp_path):
    """Workers pip install it; setup.py reads requirements-airflow.txt, so the sdist must carry it."""
    archive = worker_packages.snapfeed_sdist()
    installed = helpers.pip_install_offline(archive, tmp_path, check=False)
    assert installed.returncode == 0, installed.stderr[-2000:]
    for module in ("beam_jobs/materialize.py", "beam_jobs/preprocessing/batch_fn.py", "schemas/snapshot_pb2.py"):
        assert (tmp_path / module).is_file(), module
    assert worker_packages.archive_has_module(archive, worker_packages.SNAPFEED_MODULE)
