"""Dropped iterators of every kind: their finalizers only signal, their threads end, nothing deadlocks.

The program (``dropped_iterators_program``) runs in a process of its own against a dispatcher and two
workers in processes of their own, so its thread and descriptor counts are the consumers' alone.
"""

import json
import subprocess
import sys

import pytest

from tests import helpers
from tests.reader.service.probes import start_process, wait_for_workers


@pytest.fixture(scope="module")
def small_blocks_snapshot(tmp_path_factory):
    """4000 rows in blocks of 3: a service split (32 blocks) is about 100 rows, so 12 steps of 32 rows
    deliver splits whose acks are still to be sent when the iterator is dropped."""
    root = tmp_path_factory.mktemp("dropped")
    return helpers.write_snapshot(root, "small-blocks", helpers.id_batches([500] * 8), block_size_bytes=200)


@pytest.fixture(scope="module")
def service_processes():
    dispatcher, target, _ = start_process("dispatcher", "--port=0", "--lease_seconds=2")
    workers = [start_process("worker", f"--dispatcher={target}")[0] for _ in range(2)]
    try:
        wait_for_workers(target, 2)
        yield target
    finally:
        for process in [*workers, dispatcher]:
            process.terminate()
        for process in [*workers, dispatcher]:
            process.wait(30)


def dropped(snapshot: str, dispatcher: str, rounds: int, *flags: str, timeout: float) -> dict:
    command = [sys.executable, "-m", "tests.reader.dropped_iterators_program", snapshot, dispatcher, str(rounds)]
    try:
        done = subprocess.run(
            [*command, *flags],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=helpers.cli_env(),
            cwd=helpers.REPO_ROOT,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the program hung past {timeout} s; its stderr ends: {(exc.stderr or b'')[-6000:]!r}")
    ours = [line.strip() for line in done.stderr.splitlines() if "Timeout (" in line or "/reader/" in line]
    assert done.returncode == 0, f"exit {done.returncode}; snapfeed's frames in its stacks: {ours[:60]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_settled(report: dict, rows: int) -> None:
    assert report["rows_read"] == [2 * rows], "the reader beside the dropped ones read both its epochs whole"
    baseline, after = report["baseline"], report["after"]
    assert after["threads"] <= baseline["threads"], f"threads left running: {report['threads_left']}"
    assert after["descriptors"] <= baseline["descriptors"], report


def test_dropped_iterators_end_their_threads_and_never_deadlock_a_collector_holding_a_pool_lock(
    small_blocks_snapshot, service_processes
):
    check_settled(dropped(small_blocks_snapshot, service_processes, 20, timeout=400), 4000)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_a_thousand_dropped_iterators_of_every_kind_with_the_collector_at_every_allocation(
    small_blocks_snapshot, service_processes
):
    check_settled(dropped(small_blocks_snapshot, service_processes, 1000, "--collector-everywhere", timeout=3300), 4000)
