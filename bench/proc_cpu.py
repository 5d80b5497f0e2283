"""CPU time of other processes, read from ``/proc``: what ``resource.getrusage`` cannot give.

``getrusage`` covers this process and its reaped children only; a bench that keeps servers or
DataLoader workers alive while it measures reads their ``utime + stime`` from ``/proc/PID/stat``
(every thread of the process) before and after, and one whose servers are not its own (an
emulator started by a parent) reads how busy the whole machine was (``machine_busy_s``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads); FileNotFoundError once it is gone."""
    return _stat_cpu_s(f"/proc/{pid}/stat")


def thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of this process's thread ``native_id``; FileNotFoundError once it ended."""
    return _stat_cpu_s(f"/proc/self/task/{native_id}/stat")


def _stat_cpu_s(path: str) -> float:
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


def processes_cpu_s(pids: Iterable[int]) -> float:
    """CPU seconds of the live processes among ``pids`` (one that exited since counts nothing)."""
    total = 0.0
    for pid in pids:
        try:
            total += process_cpu_s(pid)
        except FileNotFoundError:
            continue
    return total


def child_pids() -> list[int]:
    """This process's live children, as every one of its threads lists them."""
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as children:
                pids.extend(int(pid) for pid in children.read().split())
        except FileNotFoundError:
            continue  # a thread that has ended since listed
    return pids


def live_children_cpu_s() -> float:
    """CPU seconds of this process's live children (reaped ones are in ``RUSAGE_CHILDREN``)."""
    return processes_cpu_s(child_pids())


def machine_busy_s() -> float:
    """CPU seconds all cores of this machine have been busy since boot (``/proc/stat``), every process's."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")
