"""Local Beam engines for `make bench`: an EXTERNAL SDK worker pool, a job service and a dask.distributed cluster.

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

from testing.ports import free_port

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
    with _serving(
        ["apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"], env, port, "the SDK worker pool"
    ):
        yield f"127.0.0.1:{port}"


@contextlib.contextmanager
def _serving(module_argv: list[str], env: dict[str, str], port: int, what: str) -> Iterator[None]:
    """``python -m MODULE ...`` in a session of its own until it listens on ``port``; killed with every process
    it started (a worker pool's SDK workers) at the end."""
    server = subprocess.Popen(
        [sys.executable, "-m", *module_argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        while server.poll() is None:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{what} exited with {server.returncode}")
        yield
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@contextlib.contextmanager
def job_service() -> Iterator[str]:
    """Beam's Python job service (``local_job_service_main``) in a process of its own; yields its address.

    A job submitted there with ``--job_endpoint`` runs in that process, not the
    driver's: what Flink's or Spark's job server, or Dataflow, are to a driver.
    """
    port = free_port()
    argv = ["apache_beam.runners.portability.local_job_service_main", f"--port={port}"]
    with _serving(argv, dict(os.environ, PYTHONPATH=str(REPO_ROOT)), port, "the job service"):
        yield f"localhost:{port}"


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


def portable_flags(pool_address: str, job_endpoint: str = "embed") -> list[str]:
    """The job on a portable job service (Beam's embedded one by default), its SDK workers from the pool at
    ``pool_address``."""
    return [
        "--runner=PortableRunner",
        f"--job_endpoint={job_endpoint}",
        "--environment_type=EXTERNAL",
        f"--environment_config={pool_address}",
    ]


def dask_flags(scheduler_address: str) -> list[str]:
    return ["--runner=DaskRunner", f"--dask_client_address={scheduler_address}"]
