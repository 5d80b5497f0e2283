"""Cold and warm epochs of several systems, interleaved, and what each costs in CPU per GB delivered.

On a shared 2-core machine one burst of load elsewhere can halve a rate. So every system first reads
a cold epoch, then warm epochs run in rounds: each system reads for ``round_seconds`` (at least one
epoch), then the next system, ``rounds`` times over, so a burst hits every system alike; each epoch
is timed on its own and the median epoch is reported. CPU is counted over all warm epochs: the
consumer's with ``time.process_time()`` (every thread of this process), the servers' from
``/proc/PID/stat`` (``bench.proc_cpu``), each before and after every epoch; divided by the warm
epochs' wall time they also say how many cores each side kept busy (``consumer_cores``,
``server_cores``): the side near a whole core per core it may use is the bottleneck.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

from bench import proc_cpu


@dataclasses.dataclass(frozen=True)
class System:
    """A thing read epoch by epoch. ``epoch()`` starts one (a dataset's ``iter()``) and yields each
    batch's row count; ``server_pids`` are the processes serving it, whose CPU is counted apart."""

    name: str
    epoch: Callable[[], Iterator[int]]
    server_pids: Sequence[int] = ()


@dataclasses.dataclass
class _Tally:
    """One system's warm epochs so far."""

    system: System
    rates: list[float] = dataclasses.field(default_factory=list)
    first_batches: list[float] = dataclasses.field(default_factory=list)
    rows: int = 0
    seconds: float = 0.0
    consumer_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    def read_epoch(self) -> None:
        rows, seconds, first_batch, consumer_cpu_s, server_cpu_s = timed_epoch(self.system)
        self.rates.append(rows / seconds)
        if first_batch is not None:
            self.first_batches.append(first_batch)
        self.rows += rows
        self.seconds += seconds
        self.consumer_cpu_s += consumer_cpu_s
        self.server_cpu_s += server_cpu_s

    def summary(self, cold_rows_per_s: float, bytes_per_row: int) -> dict:
        gigabytes = self.rows * bytes_per_row / 1e9
        result = {
            "cold_rows_per_s": cold_rows_per_s,
            "rows_per_s": statistics.median(self.rates),
            "first_batch_s": statistics.median(self.first_batches),
            "consumer_cpu_s_per_gb": self.consumer_cpu_s / gigabytes,
            "consumer_cores": self.consumer_cpu_s / self.seconds,
            "warm_epochs": len(self.rates),
            "warm_rows": self.rows,
            "epoch_rows_per_s": [round(rate) for rate in self.rates],
        }
        if self.system.server_pids:
            result["server_cpu_s_per_gb"] = self.server_cpu_s / gigabytes
            result["server_cores"] = self.server_cpu_s / self.seconds
        return result


def timed_epoch(system: System) -> tuple[int, float, float | None, float, float]:
    """One epoch: rows, seconds, seconds from ``iter()`` to the first batch (None when empty),
    the consumer's CPU seconds and the servers' CPU seconds."""
    servers_before = proc_cpu.processes_cpu_s(system.server_pids)
    cpu_before = time.process_time()
    started = time.perf_counter()
    first_batch, rows = None, 0
    for count in system.epoch():
        if first_batch is None:
            first_batch = time.perf_counter() - started
        rows += count
    seconds = time.perf_counter() - started
    consumer_cpu_s = time.process_time() - cpu_before
    return rows, seconds, first_batch, consumer_cpu_s, proc_cpu.processes_cpu_s(system.server_pids) - servers_before


def measure(systems: Sequence[System], rounds: int, round_seconds: float, bytes_per_row: int) -> dict[str, dict]:
    """Per system: cold rows/s, and over the warm epochs the median rows/s and first batch, CPU per GB."""
    cold = {}
    for system in systems:
        rows, seconds, *_ = timed_epoch(system)
        cold[system.name] = rows / seconds
    tallies = [_Tally(system) for system in systems]
    for _ in range(rounds):
        for tally in tallies:
            started = time.perf_counter()
            tally.read_epoch()
            while time.perf_counter() - started < round_seconds:
                tally.read_epoch()
    return {tally.system.name: tally.summary(cold[tally.system.name], bytes_per_row) for tally in tallies}
