"""Local Beam engines for `make bench`: an EXTERNAL SDK worker pool and a dask.distributed cluster.

Both on 127.0.0.1, started and stopped by the bench; their workers import
``bench.prep`` from the repository, as shipped code would be installed on a
real cluster (docs/engines-and-stores.md "Running on other engines").
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

from bench.ports import free_port

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def worker_pool(*, pythonpath: tuple[str, ...] = (), env: dict[str, str] | None = None) -> Iterator[str]:
    """``worker_pool_main`` on a free port; yields its address (``portable_flags`` makes the job use it).

    Its SDK workers run this venv's python with the repository and ``pythonpath``
    on their PYTHONPATH (what shipping code must achieve on a real cluster), and ``env``.
    """
    port = free_port()
    env = dict(
        os.environ,
        **(env or {}),
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *pythonpath]),
        PATH=os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    pool = subprocess.Popen(
        [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while pool.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            time.sleep(0.05)
        if pool.poll() is not None:
            raise RuntimeError(f"the SDK worker pool exited with {pool.returncode}")
        yield f"127.0.0.1:{port}"
    finally:
        os.killpg(pool.pid, signal.SIGKILL)  # the pool and the SDK workers it started
        pool.wait()


@contextlib.contextmanager
def dask_cluster(
    workers: int = 2, *, pythonpath: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> Iterator[str]:
    """A LocalCluster of ``workers`` processes (one thread each) on 127.0.0.1; yields its scheduler's address.

    Its workers are spawned with this process's sys.path, so ``pythonpath`` is
    on it only while they start; ``env`` is their environment's addition.
    """
    import distributed

    sys.path[:0] = pythonpath
    try:
        cluster = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            env=env or {},
        )
    finally:
        del sys.path[: len(pythonpath)]
    with cluster:
        yield cluster.scheduler_address


def portable_flags(pool_address: str) -> list[str]:
    """The job on Beam's embedded portable job service, its SDK workers from the pool at ``pool_address``."""
    return [
        "--runner=PortableRunner",
        "--job_endpoint=embed",
        "--environment_type=EXTERNAL",
        f"--environment_config={pool_address}",
    ]


def dask_flags(scheduler_address: str) -> list[str]:
    return ["--runner=DaskRunner", f"--dask_client_address={scheduler_address}"]
