"""``beam_jobs.airflow`` is imported by Airflow at DAG-parse time: the package must not drag in Beam or TF."""

import subprocess
import sys

from tests import helpers

CHECK = """
import sys
import beam_jobs, schemas.metadata, schemas.storage, schemas.state_machine
heavy = [m for m in ("apache_beam", "tensorflow", "tfx_bsl") if m in sys.modules]
assert not heavy, heavy
from beam_jobs import WriteSnapshot  # the lazy name still resolves
assert "apache_beam" in sys.modules
"""


def test_importing_beam_jobs_is_light_until_a_transform_is_used():
    completed = subprocess.run([sys.executable, "-c", CHECK], env=helpers.cli_env(), capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr[-2000:]
