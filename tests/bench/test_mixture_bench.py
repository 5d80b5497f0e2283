"""``python -m bench.mixture_bench`` at a tiny size: every system runs and every figure is reported (the speed
itself is measured by ``make bench``, not here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import helpers


@pytest.mark.slow  # 2 minutes: 64 snapshots written by Beam, 64 by tf.data
def test_the_mixture_bench_runs_every_system_and_reports_its_figures(tmp_path):
    command = [sys.executable, "-m", "bench.mixture_bench", "--megabytes=2", "--repeats=1", "--epochs=1"]
    out = subprocess.run(
        [*command, f"--workdir={tmp_path}"], cwd=helpers.REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
    figures = json.loads(out.strip().splitlines()[-1])["median"]
    assert set(figures) == {"snapfeed-one", "snapfeed-mix64", "tf.data-one", "tf.data-mix64"}
    for values in figures.values():
        assert values["elements_per_s"] > 0 and values["peak_rss_mb"] > 0 and values["threads"] >= 1
    assert "snapfeed mix64/one: speed" in out and "mix64 snapfeed/tf.data" in out
