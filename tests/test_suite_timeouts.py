"""The suite's own settings end a hung test in minutes, with every thread's stack in the log.

A test that deadlocks (its main thread waiting on a lock no thread will release, as in the dropped
iterator deadlock) is run under ``make test``'s options and ``pyproject.toml``'s timeout settings,
scaled down to seconds: the run must fail, name the test, show where each thread waited, and go on
to the next file.
"""

import subprocess
import sys
import time
import tomllib

from tests import helpers

HANGS = """
import threading

def test_waits_on_a_lock_nobody_releases():
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()
"""


def test_a_hung_test_fails_with_every_stack_and_the_run_goes_on(tmp_path):
    settings = tomllib.loads((helpers.REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert settings["timeout_method"] == "thread", "the signal method waits for the main thread to run Python"
    (tmp_path / "test_hangs.py").write_text(HANGS)
    (tmp_path / "test_after.py").write_text("def test_runs_after_the_hang():\n    assert True\n")
    (tmp_path / "pytest.ini").write_text(f"[pytest]\ntimeout = 8\ntimeout_method = {settings['timeout_method']}\n")
    started = time.monotonic()
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.stack_dumps"]
    done = subprocess.run(
        [*command, "-n", "2", "--dist", "loadfile", "--max-worker-restart=1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=helpers.cli_env(),
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "crashed while running 'test_hangs.py::test_waits_on_a_lock_nobody_releases'" in output
    assert "Timeout (0:00:04)!" in output, "faulthandler's stacks, half way to the 8 s timeout"
    assert 'test_hangs.py", line 7 in test_waits_on_a_lock_nobody_releases' in output, "the hung thread's stack"
    assert "1 passed" in output, "the other file still ran"
    assert time.monotonic() - started < 100
