"""The reader service as deployed: a dispatcher and workers, each ``python -m reader.service`` in its own process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import grpc

from bench import cpu_pinning
from reader.service.rpc import DispatcherStub
from schemas import service_pb2

#: Workers register with their first heartbeat; a cluster not complete by then failed to start.
REGISTER_SECONDS = 60.0


class ServiceCluster:
    """``with ServiceCluster(2) as cluster:`` a dispatcher at ``cluster.target`` and 2 registered workers
    at ``cluster.workers``; ``cpus`` pins all of them (every thread) to those CPUs. Stopped with SIGTERM."""

    def __init__(self, workers: int, cpus: set[int] | None = None) -> None:
        self._count = workers
        self._cpus = cpus
        self._processes: list[subprocess.Popen] = []
        self.target = ""
        self.workers: list[str] = []

    @property
    def pids(self) -> list[int]:
        """The dispatcher's and the workers' process ids."""
        return [process.pid for process in self._processes]

    def __enter__(self) -> ServiceCluster:
        try:
            self.target = self._start("dispatcher", "--port=0")
            self.workers = [self._start("worker", f"--dispatcher={self.target}") for _ in range(self._count)]
            self._wait_for_workers()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc) -> None:
        dispatcher, *workers = self._processes or [None]
        for group in (workers, [dispatcher] if dispatcher else []):  # workers first: they tell it they leave
            for process in group:
                process.send_signal(signal.SIGTERM)
            for process in group:
                process.wait(timeout=60)

    def _start(self, *args: str) -> str:
        """Starts one server; its address (first stdout line: ``serving on grpc://HOST:PORT``)."""
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        process = subprocess.Popen(
            [sys.executable, "-m", "reader.service", *args], stdout=subprocess.PIPE, text=True, env=env
        )
        self._processes.append(process)
        line = process.stdout.readline()
        if not line.startswith("serving on "):
            raise RuntimeError(f"python -m reader.service {' '.join(args)} did not start (printed {line!r})")
        if self._cpus is not None:
            cpu_pinning.pin_process(process.pid, self._cpus)
        return line.split()[-1]

    def _wait_for_workers(self) -> None:
        deadline = time.monotonic() + REGISTER_SECONDS
        with grpc.insecure_channel(self.target.removeprefix("grpc://")) as channel:
            status = DispatcherStub(channel).Status
            while len(json.loads(status(service_pb2.Empty(), timeout=10).json)["workers"]) < self._count:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self._count} workers did not register with {self.target} in time")
                time.sleep(0.1)
