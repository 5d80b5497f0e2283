"""``python -m bench.service_bench --json`` at a tiny size gives every figure issue 16 asks for; its helpers
(``/proc`` CPU readers, pinning) do what the figures rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from bench import cpu_pinning, proc_cpu
from testing.snapshots import num_rows

MODES = ("distributed_epoch", "parallel_epochs")
#: Each mode beside the local reader, in the main run and in the pinned variant (None: a number).
COMPARED = {
    "local_rows_per_s": None,
    "rows_per_s": MODES,
    "vs_local": MODES,
    "consumer_cpu_s_per_gb": ("local", *MODES),
    "consumer_cpu_vs_local": MODES,
    "worker_cpu_s_per_gb": MODES,
    "first_batch_s": ("local", *MODES),
    "first_batch_vs_local": MODES,
}
#: The issue's figures.
FIGURES = {**COMPARED, "rows": None, "ceiling_ratio": None, "vs_tfdata": MODES}
BUSY_CHILD = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\ntime.sleep(60)"


def _assert_figures(result: dict, expected: dict) -> None:
    for key, sub_keys in expected.items():
        if sub_keys is None:
            assert result[key] > 0, key
        else:
            assert set(result[key]) == set(sub_keys), key
            assert all(result[key][sub] > 0 for sub in sub_keys), (key, result[key])


@pytest.mark.slow
def test_json_has_every_figure_positive_and_counts_every_row(tmp_path):
    out = tmp_path / "service_bench.json"
    command = [sys.executable, "-m", "bench.service_bench", "--json", "--megabytes=4", "--repeats=1"]
    command += ["--warm-seconds=0.1", f"--out={out}", f"--workdir={tmp_path / 'work'}"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    completed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert json.loads(out.read_text()) == result
    assert result["rows"] == num_rows("3KB", 4)
    _assert_figures(result, FIGURES)
    if len(os.sched_getaffinity(0)) >= 2:
        _assert_figures(result["pinned"], COMPARED)
    else:
        assert "needs 2 usable CPUs" in result["pinned"]["skipped"]
    systems = result["systems"]
    # rows/s count rows received: every warm epoch delivered the snapshot once (parallel_epochs: once per worker)
    for name, copies in (("local", 1), ("distributed_epoch", 1), ("parallel_epochs", 2), ("transport_ceiling", 1)):
        assert systems[name]["warm_rows"] == systems[name]["warm_epochs"] * copies * result["rows"], name
    assert "transport ceiling / local reader" in completed.stderr  # the table, on stderr with --json


def test_process_cpu_counts_a_child_that_spins_and_nothing_once_it_is_gone():
    child = subprocess.Popen([sys.executable, "-c", BUSY_CHILD])
    try:
        deadline = time.monotonic() + 30
        while proc_cpu.process_cpu_s(child.pid) < 0.4:
            assert time.monotonic() < deadline, "the child's CPU time never showed in /proc"
            time.sleep(0.05)
        assert child.pid in proc_cpu.child_pids()
        assert proc_cpu.processes_cpu_s([child.pid]) >= 0.4
    finally:
        child.kill()
        child.wait()
    assert proc_cpu.processes_cpu_s([child.pid]) == 0.0


def _affinity(thread: int) -> set[int] | None:
    """``thread``'s CPUs, or None if it ended since it was listed (pytest-xdist's and earlier tests' threads come and go)."""
    try:
        return os.sched_getaffinity(thread)
    except ProcessLookupError:
        return None


def test_pin_process_pins_threads_started_before_and_after():
    cpus = cpu_pinning.usable_cpus()
    target = {cpus[-1]}
    started_before = threading.Event()
    threading.Thread(target=started_before.wait, daemon=True).start()
    original = os.sched_getaffinity(0)
    try:
        cpu_pinning.pin_process(os.getpid(), target)
        later = []
        thread = threading.Thread(target=lambda: later.append(os.sched_getaffinity(0)))
        thread.start()
        thread.join()
        masks = [_affinity(int(task)) for task in os.listdir("/proc/self/task")]
        masks = {mask == target for mask in masks if mask is not None}
        assert masks == {True}
        assert later == [target]
    finally:
        started_before.set()
        cpu_pinning.pin_process(os.getpid(), original)
