"""The sdist the job stages for remote workers installs, and brings what the workers import."""

from __future__ import annotations

import subprocess
import sys

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


def test_jobs_launched_at_once_from_one_checkout_each_build_the_sdist():
    """``setup.py sdist`` assembles its release tree in the source root: builds that overlap there removed
    each other's tree mid-archive until they took turns (a CI run's parallel test processes did)."""
    build = (
        "from beam_jobs.runners import worker_packages as w; "
        "print(w.archive_has_module(w.snapfeed_sdist(), w.SNAPFEED_MODULE))"
    )
    builds = [
        subprocess.Popen([sys.executable, "-c", build], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for process in builds:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-2000:]
        assert out.strip() == "True"  # the archive (removed when its process ends) holds snapfeed
