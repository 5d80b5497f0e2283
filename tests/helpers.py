"""Shared test helpers: real input files, real CLI processes, snapshots read back as rows."""

from __future__ import annotations

import collections
import faulthandler
import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Callable

import numpy as np

from schemas import columns, metadata, shard_codec, storage
from schemas.paths import SnapshotPaths
from testing.snapshots import write_snapshot as write_snapshot  # what tests call as helpers.write_snapshot

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

SCHEMA_PBTXT = """
feature { name: "id" type: INT shape { } }
feature { name: "features" type: FLOAT shape { dim { size: 4 } } }
feature { name: "label" type: INT shape { } }
"""


def write_tfrecords(directory: pathlib.Path, num_rows: int, num_files: int = 2, start: int = 0) -> list[pathlib.Path]:
    """``num_rows`` tf.Examples with a unique ``id``, spread over ``num_files`` files."""
    import tensorflow as tf

    directory.mkdir(parents=True, exist_ok=True)
    files = [directory / f"part-{i:05d}.tfrecord" for i in range(num_files)]
    writers = [tf.io.TFRecordWriter(str(f)) for f in files]
    for row in range(start, start + num_rows):
        features = {
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[row])),
            "features": tf.train.Feature(float_list=tf.train.FloatList(value=[row, row / 2, -row, 1.0])),
            "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[row % 10])),
        }
        writers[row % num_files].write(
            tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
        )
    for writer in writers:
        writer.close()
    return files


def write_schema(path: pathlib.Path) -> pathlib.Path:
    path.write_text(SCHEMA_PBTXT)
    return path


def _row_key(values: dict[str, np.ndarray], index: int) -> tuple:
    return tuple((name, np.asarray(values[name][index]).tobytes()) for name in sorted(values))


def snapshot_rows(root: str, snapshot_id: str) -> collections.Counter:
    """Every row of a finalized snapshot as a hashable key, counted (a multiset)."""
    snapshot = SnapshotPaths(str(root), snapshot_id)
    manifest = metadata.read_manifest(snapshot)
    assert manifest is not None, f"no metadata.final under {snapshot.directory}"
    rows: collections.Counter = collections.Counter()
    for shard in manifest.shards:
        path = snapshot.absolute(shard.path)
        with storage.open_random_access(path) as handle:
            reader = shard_codec.open_shard(handle, path)
            assert [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)] == list(shard.block_rows)
            for i in range(reader.num_record_batches):
                block = columns.batch_to_numpy(reader.get_batch(i))
                for index in range(len(next(iter(block.values())))):
                    rows[_row_key(block, index)] += 1
    return rows


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env.update(extra)
    return env


def run_module(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m ARGV...`` with the repository importable, its output captured (never raises on failure)."""
    return subprocess.run(
        [sys.executable, "-m", *argv], env=cli_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def run_ranks(entry, args: tuple, outputs: list[str], deadline_seconds: float = 240) -> list[dict]:
    """``entry(rank, *args)`` in ``len(outputs)`` spawned processes (torch.multiprocessing), each writing its
    result as JSON to ``outputs[rank]``; the results. Ranks that outlive the deadline are killed and the test
    fails: in DDP that means a rank waits in an all-reduce for one that took fewer steps."""
    import time

    import pytest
    import torch

    context = torch.multiprocessing.start_processes(entry, args=args, nprocs=len(outputs), join=False)
    deadline = time.monotonic() + deadline_seconds
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{len(outputs)} DDP ranks did not finish in {deadline_seconds} s: unequal steps?")
    results = []
    for out in outputs:
        with open(out) as file:
            results.append(json.load(file))
    return results


def materialize_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "beam_jobs.materialize", "--progress_interval_seconds=0", *args]


def run_materialize(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        materialize_command(*args),
        cwd=REPO_ROOT,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_materialize(*args: str, **env: str) -> subprocess.Popen:
    """A job in its own process group, so a test can kill -9 all of it."""
    return subprocess.Popen(
        materialize_command(*args),
        cwd=REPO_ROOT,
        env=cli_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def summary_fields(stdout: str) -> dict[str, str]:
    """The last line's ``key=value`` fields plus ``path``."""
    last = stdout.strip().splitlines()[-1]
    path, _, rest = last.partition(" state=")
    state, _, numbers = rest.rpartition(" rows=")
    fields = dict(item.split("=", 1) for item in f"rows={numbers}".split())
    return {"path": path, "state": state, **fields}


def final_marker_count(root: pathlib.Path) -> int:
    return len(list(root.glob("*/metadata.final")))


def id_batches(sizes: list[int], *, image_shape: tuple[int, ...] = (4, 4, 3)) -> list[dict[str, np.ndarray]]:
    """Consecutive ``id``s cut into batches of ``sizes``, with an image and a float column derived from the id."""
    batches, start = [], 0
    for size in sizes:
        ids = np.arange(start, start + size, dtype=np.int64)
        image = (ids.reshape(-1, *([1] * len(image_shape))) + np.zeros(image_shape, np.int64)) % 251
        batches.append({"id": ids, "image": image.astype(np.uint8), "value": (ids * 0.5).astype(np.float32)})
        start += size
    return batches


def pip_install_offline(archive: str, target, *, check: bool) -> subprocess.CompletedProcess:
    """``pip install`` of one package archive into ``target`` with no index and no network, as a worker would."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    return subprocess.run(
        [*command, "--target", str(target), str(archive)], capture_output=True, text=True, check=check
    )


def state_refusal(iterator, state) -> str:
    """The one-line UsageError ``iterator.set_state(state)`` refuses ``state`` with."""
    import pytest

    from schemas.errors import UsageError

    with pytest.raises(UsageError) as refused:
        iterator.set_state(state)
    message = str(refused.value)
    assert "\n" not in message
    return message


def read_at_once(read: Callable[[], object], consumers: int, timeout_s: float = 120) -> list:
    """``read()`` run by ``consumers`` threads at once (consumers of one service job, first come first served);
    what each returned, in thread order. A thread that raised raises here, naming its consumer."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(consumers, "test-consumer") as pool:
        running = [pool.submit(read) for _ in range(consumers)]
        return [future.result(timeout=timeout_s) for future in running]


def run_in_forked_child(report: Callable[[], bytes], timeout_s: int = 60) -> tuple[int, bytes]:
    """``report()`` run in a forked child (as a DataLoader worker starts), its exit code and the bytes it
    returned back through a pipe. A child that hangs is ended by an alarm after ``timeout_s``, not the
    test run, and prints every thread's stack first (faulthandler's C handler, which needs no GIL; its
    timer thread is the parent's, so the child must not use it)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child, which reports through the pipe
        status = 1
        faulthandler.register(signal.SIGALRM, all_threads=True, chain=True)
        signal.alarm(timeout_s)
        try:
            os.write(write, report())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as reply:
        reported = reply.read()
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status), reported


def epoch_in_forked_child(dataset, counted: Callable[[], int] = lambda: 0) -> tuple[int, int | None, list[int]]:
    """One epoch of ``dataset``'s ``id`` column read in a forked child (``run_in_forked_child``), then
    ``counted()`` taken there: the child's exit code, that count (None if it reported nothing), the ids."""

    def report() -> bytes:
        ids = np.concatenate([batch["id"] for batch in dataset]).astype(np.int64)
        return np.int64(counted()).tobytes() + ids.tobytes()

    status, reported = run_in_forked_child(report)
    values = np.frombuffer(reported, np.int64).tolist()
    return status, (values[0] if values else None), values[1:]
