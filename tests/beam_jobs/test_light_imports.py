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


FLAG_MISTAKE = """
import sys
from beam_jobs import materialize
code = materialize.main(["--inptu=x"])
assert code == 2, code
assert "tensorflow" not in sys.modules, "a flag mistake loaded TensorFlow"
import tensorflow  # after the command: no hook left behind
"""


def test_a_flag_mistake_is_told_without_loading_tensorflow():
    """Dropping TensorFlow's start-up lines once made every command import it first: a typo took 12 s, not 4."""
    completed = subprocess.run(
        [sys.executable, "-c", FLAG_MISTAKE], env=helpers.cli_env(), capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert "unknown flag --inptu" in completed.stderr
