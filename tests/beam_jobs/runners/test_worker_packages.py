"""The sdist the job stages for remote workers installs, and brings what the workers import."""

from __future__ import annotations

from beam_jobs.runners import worker_packages
from tests import helpers


def test_snapfeeds_staged_sdist_installs_without_network(tmp_path):
    """Workers pip install it; setup.py reads requirements-airflow.txt, so the sdist must carry it. No extra
    can be named for a staged archive, so it requires the job's dependencies itself (the plain wheel does
    not: tests/test_install.py)."""
    archive = worker_packages.snapfeed_sdist()
    installed = helpers.pip_install_offline(archive, tmp_path, check=False)
    assert installed.returncode == 0, installed.stderr[-2000:]
    for module in ("beam_jobs/materialize.py", "beam_jobs/preprocessing/batch_fn.py", "schemas/snapshot_pb2.py"):
        assert (tmp_path / module).is_file(), module
    assert worker_packages.archive_has_module(archive, worker_packages.SNAPFEED_MODULE)
    (metadata,) = tmp_path.glob("snapfeed-*.dist-info/METADATA")
    requires = [line for line in metadata.read_text().splitlines() if line.startswith("Requires-Dist:")]
    always = " ".join(line for line in requires if "extra ==" not in line)
    for needed in ("apache-beam", "tensorflow==2.21.0", "tfx-bsl", "tensorflow-transform"):
        assert needed in always, "the workers install the staged sdist with the job's dependencies (snapfeed[job])"
