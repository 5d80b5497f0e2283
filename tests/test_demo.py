"""`make demo` (README's first command) runs end to end: write, reuse, verify, read back."""

import subprocess
import sys

from tests import helpers


def test_demo_writes_reuses_and_reads_back(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "examples.demo", f"--output={tmp_path}"],
        capture_output=True,
        text=True,
        env=helpers.cli_env(),
        cwd=helpers.REPO_ROOT,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    assert "state=written rows=1797" in lines[0] and "state=reused rows=1797" in lines[1]
    assert "verified 4 shards; read 1797 rows" in completed.stdout
    assert "column image: float32[8, 8, 1]" in completed.stdout
    # The full pass: tf.Transform's analyzers over the iris CSV, read from the graph committed with the snapshot.
    assert "iris-tft/" in completed.stdout and "state=written rows=150" in completed.stdout
    assert "scale_to_z_score_sub_y: mean 5.843" in completed.stdout  # the population mean of sepal_length
    assert "scale_to_z_score_sqrt_x: variance 0.681" in completed.stdout
    assert "vocabulary species, most frequent first: ['2', '1', '0']" in completed.stdout
