"""Pinning a whole process to CPUs, including the threads it has already started.

``os.sched_setaffinity(pid, ...)`` sets one thread's mask (the thread whose id is ``pid``); threads
take their creator's mask when they start. Setting the mask of every thread a process has, until no
unpinned one is left, pins the threads it starts later too.
"""

from __future__ import annotations

import os


def usable_cpus() -> list[int]:
    """The CPU ids this process may run on, in order (not necessarily 0 and 1 in a container)."""
    return sorted(os.sched_getaffinity(0))


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` (``os.getpid()`` for this one) to ``cpus``."""
    pinned: set[int] = set()
    while unpinned := {int(task) for task in os.listdir(f"/proc/{pid}/task")} - pinned:
        for thread in unpinned:
            try:
                os.sched_setaffinity(thread, cpus)
            except ProcessLookupError:
                pass  # the thread ended since listed
            pinned.add(thread)
